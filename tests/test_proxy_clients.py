"""`memrl proxy` driven by the agent clients people use (the `clients` test extra): openai-agents' default
model (the Responses API) in a tool loop, plain and streamed, and two runs in flight rewarded by their task
ids; a multi-turn `llm -c` chat, and `memrl reward --last` between its turns; LangChain's ChatOpenAI and a
LangGraph agent (`create_agent`) in a scope; the canonical streaming loops and helpers of the `openai`
client. Each task is one retrieval and one receipt, and the receipt reaches the user where the client keeps
it (the recipes of docs/integrations.md)."""

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
from conftest import error_line, run_memrl, unavailable
from served import learned_state, seed
from test_proxy import TASK, proxy, receipts, tool_loop_responder

from memrl_cli.bank import MemoryBank
from memrl_cli.ops import memories

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



CANONICAL_CHAT = """
for chunk in stream:
    print(chunk.choices[0].delta.content or "", end="")
"""
CANONICAL_RESPONSES = """
for event in stream:
    if event.type == "response.output_text.delta":
        print(event.delta, end="")
"""


def test_the_canonical_streaming_loops_and_helpers(bank: str) -> None:
    """The loops of the openai README, run as written through the proxy: the chat one (it once raised IndexError on
    the receipt's chunk without choices) and the Responses one print what the upstream sent; the streaming helpers
    `chat.completions.stream()` and `responses.stream()` carry the receipt (a chunk event, the final completion,
    the final response), and the header has it too."""
    import contextlib
    import io

    from openai import OpenAI

    with ScriptedChatServer(lambda request: "Microwave it for 30 s.") as model, proxy(bank, model.base_url) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key="sk-client-key", max_retries=0)
        printed = []
        for code, stream in ((CANONICAL_CHAT, client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": TASK}], stream=True)),
                             (CANONICAL_RESPONSES, client.responses.create(model="m", input=TASK, stream=True))):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(code, {"stream": stream})  # noqa: S102 - the documented loop, verbatim
            printed.append(out.getvalue())
        assert printed == ["Microwave it for 30 s."] * 2

        with client.chat.completions.stream(model="m", messages=[{"role": "user", "content": TASK}]) as helper:
            events = list(helper)
            final = helper.get_final_completion()
        receipts_seen = [e.chunk.model_extra.get("memrl") for e in events if e.type == "chunk"]
        assert receipts_seen[0] == receipts_seen[-1] == {"retrieval_id": 3} and final.model_extra["memrl"] == \
            {"retrieval_id": 3}
        assert final.choices[0].message.content == "Microwave it for 30 s."
        with client.responses.stream(model="m", input=TASK) as helper:
            text = "".join(e.delta for e in helper if e.type == "response.output_text.delta")
            response = helper.get_final_response()
        assert text == "Microwave it for 30 s." and response.model_extra["memrl"] == {"retrieval_id": 4}
        with client.chat.completions.with_streaming_response.create(
                model="m", messages=[{"role": "user", "content": TASK}], stream=True) as raw:
            assert raw.headers["X-Memrl-Retrieval"] == "5"
    assert [rid for rid, _ in receipts(bank)] == [1, 2, 3, 4, 5]


PLANTS = "water the plants on the balcony with the can"


def test_two_agents_in_flight_each_rewarded_by_its_task_id(bank: str) -> None:
    """Two openai-agents `Runner.run`s at once (a plain run keeps no receipt), each given its task id through
    `RunConfig(model_settings=ModelSettings(extra_headers=...))`: each run is one receipt with its own memory; each
    task is rewarded by its id through the proxy, and only its memory's Q moves."""
    agents = need("agents")
    from openai import AsyncOpenAI

    with MemoryBank(bank) as b:
        plant = b.ingest("water the plants on the balcony", "SCRIPT: fill the can, water each pot", "success").id

    @agents.function_tool
    def oven(seconds: int) -> str:
        """Heat the dish in the microwave oven for `seconds` seconds."""
        return f"{seconds} s done"

    with ScriptedChatServer(tool_loop_responder) as model, proxy(bank, model.base_url, "--k2", "1") as url:
        agents.set_tracing_disabled(True)
        agent = agents.Agent(name="helper", instructions="You help.", tools=[oven])
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-client-key", max_retries=0)

        def config(task: str) -> Any:
            return agents.RunConfig(model_settings=agents.ModelSettings(extra_headers={"X-Memrl-Task-Id": task}))

        async def both() -> list[Any]:
            agents.set_default_openai_client(client, use_for_tracing=False)
            agents.set_default_openai_api("responses")
            results = await asyncio.gather(agents.Runner.run(agent, TASK, run_config=config("ticket-egg")),
                                           agents.Runner.run(agent, PLANTS, run_config=config("ticket-plant")))
            for task, reward in (("ticket-egg", 1), ("ticket-plant", -1)):
                await client.post("/memrl/rewards", body={"task": task, "reward": reward}, cast_to=object)
            return results

        results = asyncio.run(both())
        assert [r.final_output for r in results] == ["Done: the egg is warm."] * 2
        egg_calls = [memory_messages(r) for r in model.requests if "egg" in json.dumps(r.get("input"))]
        plant_calls = [memory_messages(r) for r in model.requests if "plants on the balcony with" in json.dumps(r.get("input"))]
        assert len(egg_calls) == len(plant_calls) == 2 and egg_calls[0] == egg_calls[1] and plant_calls[0] == plant_calls[1]
        assert "each pot" in json.dumps(plant_calls[0]) and "each pot" not in json.dumps(egg_calls[0])
    with MemoryBank(bank, create=False) as b:
        q = {int(i): q for i, q, _ in b.store.q_and_initial_q()}
        tasks = sorted((r["task_id"], r["rewarded"]) for r in memories.receipts(b))
    assert q == {1: 0.3, 2: 0.0, plant: -0.3}  # each task's own memory (k2=1), and nothing else
    assert tasks == [("ticket-egg", True), ("ticket-plant", True)]


@pytest.mark.slow  # four `llm` processes and three `memrl` ones
def test_llm_chat_then_reward_last(bank: str, tmp_path: Path) -> None:
    """The documented `llm` flow: a chat, `memrl reward --last 1` (which says which task it rewarded), `llm -c`
    (the task ended with its reward: a new task, a new receipt), `memrl reward --last -1` rewards that one, not an
    older task; run again, it refuses in one line and writes nothing."""
    need("llm")
    home = tmp_path / "llm"
    home.mkdir()
    with ScriptedChatServer(lambda request: "Microwave it for 30 s.") as model, proxy(bank, model.base_url) as url:
        (home / "extra-openai-models.yaml").write_text(
            f"- model_id: memrl\n  model_name: gpt-4o-mini\n  api_base: {url}/v1\n", encoding="utf-8")
        llm_command(home, "-m", "memrl", TASK)
        first = run_memrl("reward", "--last", "--reward", "1", "--db", bank).stdout
        assert first.startswith(f'rewarded retrieval 1 ("{TASK}")')
        llm_command(home, "-c", "and then put it on the table")
        assert len(memory_messages(model.requests[-1])) == 1  # the new task's memories
        second = run_memrl("reward", "--last", "--reward", "-1", "--db", bank).stdout
        assert second.startswith(f'rewarded retrieval 2 ("{TASK}")')
        before = learned_state(bank)
        refused = error_line(run_memrl("reward", "--last", "--reward", "-1", "--db", bank, ok=False))
        assert "the newest receipt is retrieval 2" in refused and "already rewarded" in refused
        assert learned_state(bank) == before
    assert [rid for rid, _ in receipts(bank)] == [1, 2]


def test_a_langgraph_agent_is_one_task_in_its_scope(bank: str) -> None:
    """LangChain's `create_agent` (a LangGraph tool loop) over ChatOpenAI through the proxy, with a task id and a
    scope in `default_headers`: one receipt for the run's two model calls, the same memories in both; bob's task
    never gets alice's memory; the task is rewarded by its id."""
    need("langchain")
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    with MemoryBank(bank) as b:
        b.ingest("heat an egg in the microwave", "ALICE'S NOTE: her microwave runs hot", "success", scope="user:alice")
        bobs = b.ingest("heat an egg in the microwave", "BOB'S NOTE: his cups are in the drawer", "success",
                        scope="user:bob").id

    @tool
    def oven(seconds: int) -> str:
        """Heat the dish in the microwave oven for `seconds` seconds."""
        return f"{seconds} s done"

    with ScriptedChatServer(tool_loop_responder) as model, proxy(bank, model.base_url) as url:
        chat = ChatOpenAI(base_url=f"{url}/v1", api_key="sk-client-key", model="gpt-4o-mini", max_retries=0,
                          default_headers={"X-Memrl-Task-Id": "ticket-7", "X-Memrl-Scope": "user:bob"})
        agent = create_agent(chat, tools=[oven], system_prompt="You cook.")
        state = agent.invoke({"messages": [{"role": "user", "content": TASK}]})
        assert state["messages"][-1].content == "Done: the egg is warm."
        sent = [json.dumps(memory_messages(r)) for r in model.requests]
        assert len(sent) == 2 and sent[0] == sent[1] and "BOB'S NOTE" in sent[0] and "ALICE" not in sent[0]
        done = httpx2.post(f"{url}/v1/memrl/rewards", json={"task": "ticket-7", "reward": 1},
                           headers={"X-Memrl-Scope": "user:bob"})
        assert done.status_code == 200 and [u["id"] for u in done.json()["updated"]] == [bobs]
    assert [rid for rid, _ in receipts(bank)] == [1]
