"""`memrl mcp`, driven by the official MCP SDK's own client (ClientSession) over stdio and over
streamable HTTP, against a real server subprocess; compared with the same operations through the CLI."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from conftest import error_line, run_memrl
from served import cli_env, learned_state, seed, serving
from test_cli import as_json, memrl

from memrl_cli.bank import MemoryBank

TOOLS = {"retrieve", "remember", "reward", "top_memories", "explain", "stats"}
TOKEN = "a-test-token-of-some-length"
TIMESTAMPS = ("created_at", "updated_at", "last_used_at")


def stdio(db: str, *extra: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "memrl_cli", "mcp", "--db", db, *extra],
                                 env=cli_env())


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool call that must succeed; its text is the JSON object it also returns as structured content."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert json.loads(result.content[0].text) == result.structured_content
    return result.structured_content


def without_timestamps(memories: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if k not in TIMESTAMPS} for m in memories]


async def scripted_session(session: ClientSession) -> list[dict[str, Any]]:
    """retrieve → remember → reward → top_memories, as an agent would."""
    await session.initialize()
    hit = await call(session, "retrieve", query="warm up an egg", k2=1)
    new = await call(session, "remember", intent="boil an egg", experience="SCRIPT: pot, water, 8 minutes",
                     outcome="success")
    updated = await call(session, "reward", retrieval_id=hit["retrieval_id"], reward=1)
    top = await call(session, "top_memories", n=5)
    return [hit, new, updated, top]


def same_through_cli(db: str) -> list[dict[str, Any]]:
    """The same four operations as CLI commands."""
    hit = as_json(memrl(db, "retrieve", "warm up an egg", "--k2", "1", "--json"))
    new = as_json(memrl(db, "ingest", "--intent", "boil an egg", "--experience", "SCRIPT: pot, water, 8 minutes",
                        "--outcome", "success", "--json"))
    updated = as_json(memrl(db, "reward", "--retrieval", str(hit["retrieval_id"]), "--reward", "1", "--json"))
    top = as_json(memrl(db, "inspect", "--top-q", "5", "--json"))
    return [hit, new, updated, top]


@pytest.mark.slow
def test_stdio_session_changes_the_bank_as_the_cli_does(bank_at: Callable[[str], str]) -> None:
    via_mcp, via_cli = bank_at("mcp"), bank_at("cli")
    seed(via_mcp)
    seed(via_cli)

    async def run() -> tuple[list[str], list[dict[str, Any]]]:
        async with stdio_client(stdio(via_mcp)) as (read, write), ClientSession(read, write) as session:
            answers = await scripted_session(session)
            return [t.name for t in (await session.list_tools()).tools], answers

    names, answers = anyio.run(run)
    assert set(names) == TOOLS
    expected = same_through_cli(via_cli)
    answers[3]["memories"] = without_timestamps(answers[3]["memories"])
    expected[3]["memories"] = without_timestamps(expected[3]["memories"])
    assert answers == expected
    assert answers[2]["updated"] == [{"id": 2, "q_before": 0.0, "q_after": 0.3}]  # the selected memory learned
    assert learned_state(via_mcp) == learned_state(via_cli)


@pytest.mark.slow
def test_the_retrieve_tool_selects_with_the_chosen_selector(tmp_path: Any) -> None:
    """`memrl mcp --selector conditioned-t` (the recommended method): its receipts record that selector;
    an unknown selector is one error line before serving, and nothing is written."""
    db = str(tmp_path / "bank.db")
    seed(db)
    before = learned_state(db)
    assert "selector must be one of" in error_line(run_memrl("mcp", "--db", db, "--selector", "best", ok=False))
    assert learned_state(db) == before

    async def run() -> dict[str, Any]:
        async with stdio_client(stdio(db, "--selector", "conditioned-t")) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            return await call(session, "retrieve", query="warm up an egg", k2=1)

    hit = anyio.run(run)
    with MemoryBank(db, create=False) as bank:
        params = json.loads(bank.conn.execute("SELECT params FROM retrievals WHERE id = ?",
                                              (hit["retrieval_id"],)).fetchone()[0])
    assert params["selector"] == "conditioned-t"


def test_http_tools_errors_and_read_only(tmp_path: Any) -> None:
    db = str(tmp_path / "bank.db")
    seed(db)
    before = learned_state(db)
    with serving("mcp", "--http", "127.0.0.1:0", "--db", db) as url:
        async def run() -> None:
            async with streamable_http_client(f"{url}/mcp") as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                assert {t.name for t in (await session.list_tools()).tools} == TOOLS
                for tool, arguments, message in (
                        ("reward", {"retrieval_id": 99, "reward": 1}, "unknown retrieval id 99"),
                        ("reward", {"retrieval_id": 1, "memory_ids": [1], "reward": 1},
                         "give either a retrieval id or memory ids, not both or neither"),
                        ("reward", {"memory_ids": [1], "reward": 1, "alpha": 2}, "alpha"),
                        ("remember", {"intent": " ", "experience": "x"}, "intent must be a non-empty string"),
                        ("remember", {"intent": "x", "experience": "y", "outcome": "great"}, "outcome must be one of"),
                        ("retrieve", {"query": "egg", "lam": 2}, "lambda must be a number in [0, 1]"),
                        ("explain", {"retrieval_id": 7}, "unknown retrieval id 7"),
                        ("retrieve", {"query": "egg", "k1": "many"}, "argument k1 of retrieve: Input should be a valid integer"),
                        ("remember", {"experience": "y"}, "argument intent of remember: Field required")):
                    result = await session.call_tool(tool, arguments)
                    assert result.is_error, (tool, arguments)
                    text = result.content[0].text
                    assert message in text and "\n" not in text, text
                    assert result.structured_content == {"error": {"type": "MemrlError", "message": text}}
                stats = await call(session, "stats")
                assert stats["count"] == 2 and stats["engine"] == "sqlite"
        anyio.run(run)
    assert learned_state(db) == before  # nothing written by the failed calls

    with serving("mcp", "--http", "127.0.0.1:0", "--read-only", "--db", db) as url:
        async def read_only() -> None:
            async with streamable_http_client(f"{url}/mcp") as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                assert {t.name for t in (await session.list_tools()).tools} == TOOLS - {"remember", "reward"}
                assert (await session.call_tool("reward", {"memory_ids": [1], "reward": 1})).is_error
                hit = await call(session, "retrieve", query="warm up an egg")
                assert hit["retrieval_id"] == 1  # receipts are still kept, for a trusted harness to reward
        anyio.run(read_only)
    assert learned_state(db)["rewards"] == [] and learned_state(db)["memories"] == before["memories"]


def test_beyond_loopback_needs_the_token(tmp_path: Any) -> None:
    db = str(tmp_path / "bank.db")
    seed(db)
    refused = memrl(db, "mcp", "--http", "0.0.0.0:0", ok=False)
    assert refused.returncode == 1 and "give --token" in refused.stderr
    before = learned_state(db)
    with serving("mcp", "--http", "127.0.0.2:0", "--db", db, env=cli_env(MEMRL_TOKEN=TOKEN)) as url:
        message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": "reward", "arguments": {"memory_ids": [1], "reward": 1}}}
        for headers in ({}, {"Authorization": "Bearer wrong-token-of-some-length"}, {"X-Memrl-Token": "nope"}):
            response = httpx2.post(f"{url}/mcp", json=message, headers=headers | {"Accept": "application/json, text/event-stream"})
            assert response.status_code == 401
            assert "missing or wrong token" in response.json()["error"]["message"]
        assert learned_state(db) == before

        async def with_token() -> None:
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as client, \
                    streamable_http_client(f"{url}/mcp", http_client=client) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                updated = await call(session, "reward", memory_ids=[1], reward=1)
                assert updated == {"updated": [{"id": 1, "q_before": 0.0, "q_after": 0.3}]}
        anyio.run(with_token)


@pytest.mark.slow
def test_eight_concurrent_http_clients_lose_no_update(bank_at: Callable[[str], str]) -> None:
    db = bank_at("bank")
    with MemoryBank(db) as bank:
        bank.ingest("water the plants", "SCRIPT: fill the can; water each pot", "success")
    with serving("mcp", "--http", "127.0.0.1:0", "--db", db) as url:
        async def client(rids: list[int]) -> None:
            async with streamable_http_client(f"{url}/mcp") as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                hit = await call(session, "retrieve", query="water the plants")
                await call(session, "reward", retrieval_id=hit["retrieval_id"], reward=1)
                rids.append(hit["retrieval_id"])

        async def run() -> list[int]:
            rids: list[int] = []
            async with anyio.create_task_group() as group:
                for _ in range(8):
                    group.start_soon(client, rids)
            return rids
        rids = anyio.run(run)
    assert sorted(rids) == list(range(1, 9))
    with MemoryBank(db, create=False) as bank:
        q, visits = bank.conn.execute("SELECT q, visits FROM memories").fetchone()
    assert visits == 8 and q == pytest.approx(1 - 0.7 ** 8, abs=1e-12)  # eight updates, applied one after another


def test_documented_client_configs_are_json() -> None:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "integrations.md").read_text(encoding="utf-8")
    configs = [json.loads(block) for block in re.findall(r"```json\n(.*?)```", text, flags=re.DOTALL)]
    assert configs[0]["mcpServers"]["memrl"]["command"] == "memrl" and configs[0]["mcpServers"]["memrl"]["args"] == ["mcp"]
    assert configs[1]["mcpServers"]["memrl"]["url"].endswith("/mcp")
