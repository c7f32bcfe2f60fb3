"""`memrl proxy` driven by the agent clients people use (the `clients` test extra): openai-agents' default
model (the Responses API) in a tool loop, plain and streamed; a multi-turn `llm -c` chat; LangChain's
ChatOpenAI. Each task is one retrieval and one receipt, and the receipt reaches the user where the
client keeps it (the recipes of docs/integrations.md)."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest
from benchmarks.testing.chat_server import ScriptedChatServer
from conftest import unavailable
from served import seed
from test_proxy import TASK, proxy, receipts, tool_loop_responder

MEMORIES = "<memrl-memories>"


def need(module: str) -> Any:
    """The client module, or a skip (a failure under CI) naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        unavailable(f"{module} is not installed ({exc}): pip install -e '.[clients]'", "the clients extra")


def memory_messages(request: dict) -> list[Any]:
    """The memory messages of a chat or Responses API request, as forwarded upstream."""
    items = request.get("messages") or request.get("input") or []
    return [m for m in items if isinstance(m, dict) and MEMORIES in str(m.get("content"))]


@pytest.fixture
def bank(tmp_path: Path) -> str:
    db = str(tmp_path / "bank.db")
    seed(db)
    return db


def test_openai_agents_default_model_one_receipt_per_run(bank: str) -> None:
    """An openai-agents Agent with a function tool, on the SDK's default model (the Responses API): each run
    is a tool loop of two model calls that share one retrieval and one receipt; a streamed run's
    `response.completed` events carry the receipt."""
    agents = need("agents")
    from openai import AsyncOpenAI

    calls: list[int] = []

    @agents.function_tool
    def oven(seconds: int) -> str:
        """Heat the dish in the microwave oven for `seconds` seconds."""
        calls.append(seconds)
        return f"{seconds} s done"

    with ScriptedChatServer(tool_loop_responder) as model, proxy(bank, model.base_url) as url:
        agents.set_tracing_disabled(True)
        agent = agents.Agent(name="cook", instructions="You cook.", tools=[oven])

        async def runs() -> tuple[Any, list[Any]]:
            agents.set_default_openai_client(AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-client-key",
                                                         max_retries=0), use_for_tracing=False)
            agents.set_default_openai_api("responses")
            result = await agents.Runner.run(agent, TASK)
            run = agents.Runner.run_streamed(agent, TASK)
            return result, [event.data async for event in run.stream_events() if event.type == "raw_response_event"
                            and event.data.type == "response.completed"]

        result, completed = asyncio.run(runs())
        assert result.final_output == "Done: the egg is warm."
        plain = model.requests[:2]
        assert all("input" in r for r in plain)  # the Responses API
        first, second = (memory_messages(r) for r in plain)
        assert len(first) == 1 and second == first  # the same memories in both calls of the task
        assert [e.response.model_extra["memrl"] for e in completed] == [{"retrieval_id": 2}] * 2
        assert calls == [30, 30] and len(model.requests) == 4
    assert [rid for rid, _ in receipts(bank)] == [1, 2]


def llm_command(home: Path, *args: str) -> str:
    """Run the `llm` CLI (the package's own entry point) with its configuration in `home`; its stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "LLM_"))}
    env |= {"LLM_USER_PATH": str(home), "OPENAI_API_KEY": "sk-client-key", "LLM_LOAD_PLUGINS": ""}  # no plugins
    done = subprocess.run([sys.executable, "-m", "llm", *args], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow  # eight `llm` processes: ~45 s on two busy cores
def test_an_llm_chat_is_one_task(bank: str, tmp_path: Path) -> None:
    """`llm` with the proxy as an extra OpenAI model (docs/integrations.md): a streamed chat continued with
    `llm -c` is one task (one retrieval, the same memories in every call); with `--task-message latest`, each
    new user message is a task of its own. `--no-stream` keeps the receipt in `llm logs --json`."""
    need("llm")
    with ScriptedChatServer(lambda request: "Microwave it for 30 s.") as model:
        for mode, last in (("first", 1), ("latest", 4)):
            home = tmp_path / f"llm-{mode}"
            home.mkdir()
            with proxy(bank, model.base_url, "--task-message", mode) as url:
                (home / "extra-openai-models.yaml").write_text(
                    f"- model_id: memrl\n  model_name: gpt-4o-mini\n  api_base: {url}/v1\n", encoding="utf-8")
                assert llm_command(home, "-m", "memrl", TASK).strip() == "Microwave it for 30 s."
                llm_command(home, "-c", "and then put it on the table")
                llm_command(home, "-c", "--no-stream", "thanks")
                logged = json.loads(llm_command(home, "logs", "-n", "1", "--json"))
                assert logged[0]["response_json"]["memrl"] == {"retrieval_id": last}
        first_chat = model.requests[:3]
        assert [len(r["messages"]) for r in first_chat] == [2, 4, 6]  # the memory message, then the chat
        assert all(memory_messages(r) == memory_messages(first_chat[0]) for r in first_chat)
    assert [query for _, query in receipts(bank)] == [TASK, TASK, "and then put it on the table", "thanks"]


def test_langchain_sees_the_receipt_and_one_task(bank: str) -> None:
    """LangChain's ChatOpenAI (Chat Completions, and `use_responses_api`) through the proxy: memories injected,
    the receipt in `response_metadata["headers"]` with `include_response_headers=True`; a tool loop given one
    task id (`default_headers`) is one receipt, rewarded once through the proxy."""
    need("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    with ScriptedChatServer(tool_loop_responder) as model, proxy(bank, model.base_url) as url:
        for responses in (False, True):
            chat = ChatOpenAI(base_url=f"{url}/v1", api_key="sk-client-key", model="gpt-4o-mini", max_retries=0,
                              use_responses_api=responses, include_response_headers=True,
                              default_headers={"X-Memrl-Task-Id": f"langchain-{responses}"})
            oven = {"type": "function", "function": {"name": "oven", "description": "Heat in the microwave.",
                                                     "parameters": {"type": "object",
                                                                    "properties": {"seconds": {"type": "integer"}}}}}
            bound = chat.bind_tools([oven])
            messages: list[Any] = [HumanMessage(TASK)]
            call = bound.invoke(messages)
            assert call.tool_calls and call.tool_calls[0]["name"] == "oven"
            messages += [call, ToolMessage("30 s done", tool_call_id=call.tool_calls[0]["id"])]
            answer = bound.invoke(messages)
            assert answer.text == "Done: the egg is warm."
            receipt = {m.response_metadata["headers"]["x-memrl-retrieval"] for m in (call, answer)}
            assert receipt == {"2" if responses else "1"}
            assert memory_messages(model.requests[-1]) == memory_messages(model.requests[-2]) != []
            reward = httpx2.post(f"{url}/v1/memrl/rewards", json={"retrieval_id": int(receipt.pop()), "reward": 1})
            assert reward.status_code == 200 and reward.json()["updated"]
        streamed = ChatOpenAI(base_url=f"{url}/v1", api_key="sk-client-key", model="gpt-4o-mini", max_retries=0,
                              include_response_headers=True)
        chunks = list(streamed.stream(TASK))  # the model answers with a call of the oven tool
        assert any(c.tool_call_chunks for c in chunks) and chunks[0].response_metadata["headers"]["x-memrl-retrieval"] == "3"
    assert [rid for rid, _ in receipts(bank)] == [1, 2, 3]

