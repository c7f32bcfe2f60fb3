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

TOOLS = {"retrieve", "remember", "reward", "reward_task", "reward_memories", "top_memories", "explain", "stats"}
WRITES = {"remember", "reward", "reward_task", "reward_memories"}
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
    mcp_state, cli_state = learned_state(via_mcp), learned_state(via_cli)
    # the one designed difference: an MCP request without a scope acts in no scope (the pattern None),
    # the CLI's owner without --scope in every scope; over these unscoped memories both select the same
    assert [json.loads(r[2])["scopes"] for r in mcp_state["retrievals"]] == [[None]]
    assert [json.loads(r[2])["scopes"] for r in cli_state["retrievals"]] == [[]]
    for state in (mcp_state, cli_state):
        state["retrievals"] = [r[:2] + (json.dumps({**json.loads(r[2]), "scopes": "-"}),) + r[3:]
                               for r in state["retrievals"]]
    assert mcp_state == cli_state


@pytest.mark.slow
def test_the_retrieve_tool_selects_with_the_chosen_selector(tmp_path: Any) -> None:
    """`memrl mcp --selector memrl-conditioned`: its receipts record that selector;
    an unknown selector is one error line before serving, and nothing is written."""
    db = str(tmp_path / "bank.db")
    seed(db)
    before = learned_state(db)
    assert "selector must be one of" in error_line(run_memrl("mcp", "--db", db, "--selector", "best", ok=False))
    assert learned_state(db) == before

    async def run() -> dict[str, Any]:
        async with stdio_client(stdio(db, "--selector", "memrl-conditioned")) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            return await call(session, "retrieve", query="warm up an egg", k2=1)

    hit = anyio.run(run)
    with MemoryBank(db, create=False) as bank:
        params = json.loads(bank.conn.execute("SELECT params FROM retrievals WHERE id = ?",
                                              (hit["retrieval_id"],)).fetchone()[0])
    assert params["selector"] == "memrl-conditioned"


def test_http_tools_errors_and_read_only(tmp_path: Any) -> None:
    db = str(tmp_path / "bank.db")
    seed(db)
    before = learned_state(db)
    with serving("mcp", "--host", "127.0.0.1", "--port", "0", "--db", db) as url:
        async def run() -> None:
            async with streamable_http_client(f"{url}/mcp") as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                assert {t.name for t in (await session.list_tools()).tools} == TOOLS
                for tool, arguments, message in (
                        ("reward", {"retrieval_id": 99, "reward": 1}, "unknown retrieval id 99"),
                        ("reward", {"retrieval_id": 1, "memory_ids": [1], "reward": 1},
                         "unknown argument memory_ids of reward; its arguments are retrieval_id, reward, source, scope"),
                        ("reward_memories", {"memory_ids": [1], "reward": 1, "alpha": 0.9},
                         "unknown argument alpha of reward_memories; its arguments are memory_ids, reward, source, "
                         "scope"),
                        ("remember", {"intent": " ", "experience": "x"}, "intent must be a non-empty string"),
                        ("remember", {"intent": "x", "experience": "y", "outcome": "great"},
                         "argument outcome of remember: Input should be 'success', 'failure' or 'unknown'"),
                        ("retrieve", {"query": "egg", "lam": 2},
                         "argument lam of retrieve: Input should be less than or equal to 1"),
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

    with serving("mcp", "--host", "127.0.0.1", "--port", "0", "--read-only", "--db", db) as url:
        async def read_only() -> None:
            async with streamable_http_client(f"{url}/mcp") as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                assert {t.name for t in (await session.list_tools()).tools} == TOOLS - WRITES
                assert (await session.call_tool("reward_memories", {"memory_ids": [1], "reward": 1})).is_error
                hit = await call(session, "retrieve", query="warm up an egg")
                assert hit["retrieval_id"] == 1  # receipts are still kept, for a trusted harness to reward
        anyio.run(read_only)
    assert learned_state(db)["rewards"] == [] and learned_state(db)["memories"] == before["memories"]


def test_beyond_loopback_needs_the_token(tmp_path: Any) -> None:
    db = str(tmp_path / "bank.db")
    seed(db)
    refused = memrl(db, "mcp", "--host", "0.0.0.0", "--port", "0", ok=False)
    assert refused.returncode == 1 and "give --token" in refused.stderr
    before = learned_state(db)
    with serving("mcp", "--host", "127.0.0.2", "--port", "0", "--db", db, env=cli_env(MEMRL_TOKEN=TOKEN)) as url:
        message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": "reward_memories", "arguments": {"memory_ids": [1], "reward": 1}}}
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
                updated = await call(session, "reward_memories", memory_ids=[1], reward=1)
                assert updated == {"updated": [{"id": 1, "q_before": 0.0, "q_after": 0.3}]}
        anyio.run(with_token)


@pytest.mark.slow
def test_eight_concurrent_http_clients_lose_no_update(bank_at: Callable[[str], str]) -> None:
    db = bank_at("bank")
    with MemoryBank(db) as bank:
        bank.ingest("water the plants", "SCRIPT: fill the can; water each pot", "success")
    with serving("mcp", "--host", "127.0.0.1", "--port", "0", "--db", db) as url:
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


# The contract every tool publishes: the bounds of each bounded argument (None: unbounded), the required ones.
BOUNDS = {("retrieve", "k1"): (1, 100), ("retrieve", "k2"): (1, 20), ("retrieve", "lam"): (0, 1),
          ("retrieve", "threshold"): (-1, 1), ("top_memories", "n"): (1, 100), ("explain", "retrieval_id"): (1, None),
          ("reward", "retrieval_id"): (1, None), ("reward", "reward"): (-1, 1), ("reward_memories", "reward"): (-1, 1),
          ("reward_task", "reward"): (-1, 1)}
REQUIRED = {"retrieve": {"query"}, "top_memories": set(), "explain": {"retrieval_id"}, "stats": set(),
            "remember": {"intent", "experience"}, "reward": {"retrieval_id", "reward"},
            "reward_task": {"task_id", "reward"}, "reward_memories": {"memory_ids", "reward"}}


def check_contract(tools: list[Any], reward_range: tuple[float, float] = (-1, 1)) -> None:
    """Every schema: a valid JSON Schema, an object refusing unknown arguments, with no combinator at its top
    (Claude's and OpenAI's tool APIs refuse one there), its bounds, enums and required arguments; no alpha."""
    from jsonschema import Draft202012Validator

    schemas = {t.name: t.input_schema for t in tools}
    for name, schema in schemas.items():
        Draft202012Validator.check_schema(schema)
        assert schema["type"] == "object" and schema["additionalProperties"] is False, name
        assert not set(schema) & {"oneOf", "anyOf", "allOf", "not", "if"}, name
        assert set(schema.get("required", [])) == REQUIRED[name], name
    for (name, argument), (low, high) in BOUNDS.items():
        if name in schemas:
            if argument == "reward":
                low, high = reward_range
            prop = schemas[name]["properties"][argument]
            assert (prop.get("minimum"), prop.get("maximum")) == (low, high), (name, argument, prop)
    if "remember" in schemas:
        assert schemas["remember"]["properties"]["outcome"]["enum"] == ["success", "failure", "unknown"]
        assert schemas["remember"]["properties"]["intent"]["minLength"] == 1
    if "reward_memories" in schemas:
        ids = schemas["reward_memories"]["properties"]["memory_ids"]
        assert (ids["minItems"], ids["maxItems"], ids["items"]["minimum"]) == (1, 100, 1)
        for name in ("reward", "reward_task", "reward_memories"):
            assert "alpha" not in schemas[name]["properties"]  # the server sets the learning rate
    assert schemas["retrieve"]["properties"]["query"]["maxLength"] == 8000


# Calls outside the contract: each is refused with one line naming the argument.
REFUSED = [
    ("reward", {"retrieval_id": 1, "reward": 5}, "argument reward of reward: Input should be less than or equal to 1"),
    ("reward", {"retrieval_id": 1, "reward": -1.01}, "argument reward of reward: Input should be greater than or equal to -1"),
    ("reward", {"retrieval_id": 1, "reward": 1, "alpha": 1}, "unknown argument alpha of reward"),
    ("reward", {"retrieval_id": 0, "reward": 1}, "argument retrieval_id of reward"),
    ("reward", {"retrieval_id": 1}, "argument reward of reward: Field required"),
    ("reward", {"reward": 1}, "argument retrieval_id of reward: Field required"),
    ("reward_memories", {"memory_ids": [1], "reward": 1.5}, "argument reward of reward_memories"),
    ("reward_memories", {"memory_ids": [], "reward": 1}, "argument memory_ids of reward_memories"),
    ("reward_memories", {"memory_ids": [0], "reward": 1}, "argument memory_ids.0 of reward_memories"),
    ("reward_memories", {"memory_ids": [1], "retrieval_id": 1, "reward": 1}, "unknown argument retrieval_id of reward_memories"),
    ("retrieve", {"query": "egg", "k1": 0}, "argument k1 of retrieve"),
    ("retrieve", {"query": "egg", "k2": 21}, "argument k2 of retrieve"),
    ("retrieve", {"query": "egg", "threshold": 1.5}, "argument threshold of retrieve"),
    ("retrieve", {"query": ""}, "argument query of retrieve"),
    ("retrieve", {"query": "egg", "selector": "ucb"}, "unknown argument selector of retrieve; its arguments are "
                                                      "query, k1, k2, lam, threshold, task_id, scope"),
    ("reward", {"retrieval_id": "1", "reward": 1}, "argument retrieval_id of reward: Input should be a valid integer"),
    ("explain", {"retrieval_id": "1"}, "argument retrieval_id of explain: Input should be a valid integer"),
    ("retrieve", {"query": "egg", "k2": "2"}, "argument k2 of retrieve: Input should be a valid integer"),
    ("reward", {"retrieval_id": 1, "reward": "1"}, "argument reward of reward: Input should be a valid number"),
    ("retrieve", {"query": "egg " * 200_000}, "argument query of retrieve: String should have at most 8000 characters"),
    ("remember", {"intent": "egg " * 200_000, "experience": "y"}, "argument intent of remember: String should have at "
                                                                  "most 8000 characters"),
    ("retrieve", {"query": "egg", "scope": "user:*"}, "scope 'user:*' contains a pattern character"),
    ("reward_task", {"task_id": "nope", "reward": 1}, "no retrieval has task id 'nope' without a scope"),
    ("reward_task", {"task_id": "", "reward": 1}, "argument task_id of reward_task"),
    ("remember", {"intent": "x", "experience": "y", "outcome": "great"}, "argument outcome of remember"),
    ("remember", {"intent": "x", "experience": "y", "q": 1}, "unknown argument q of remember"),
    ("top_memories", {"n": 0}, "argument n of top_memories"),
    ("top_memories", {"n": 101}, "argument n of top_memories"),
    ("explain", {"retrieval_id": -1}, "argument retrieval_id of explain"),
    ("stats", {"verbose": True}, "unknown argument verbose of stats; stats takes no arguments"),
]


async def refusals(session: ClientSession, db: str) -> None:
    """The published contract, then every call outside it refused (one line naming the argument); no result
    names the bank's location."""
    await session.initialize()
    check_contract((await session.list_tools()).tools)
    texts = []
    for tool, arguments, message in REFUSED:
        result = await session.call_tool(tool, arguments)
        text = result.content[0].text
        assert result.is_error and message in text and "\n" not in text, (tool, arguments, text)
        texts.append(text)
    stats = await call(session, "stats")
    assert "path" not in stats and stats["reward_range"] == [-1, 1]
    for tool, arguments in (("explain", {"retrieval_id": 1}), ("top_memories", {}), ("retrieve", {"query": "egg"}),
                            ("explain", {"retrieval_id": 9})):
        texts.append((await session.call_tool(tool, arguments)).content[0].text)
    assert not [t for t in texts + [json.dumps(stats)] if db in t]


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_tools_publish_their_contract_and_refuse_calls_outside_it(tmp_path: Any, transport: str) -> None:
    """Over stdio and over streamable HTTP: the schemas (bounds, enums, no unknown argument, no alpha), and
    each call outside them refused with nothing written (the issue's reward of 5 took Q from 0.3 to 1.71)."""
    db = str(tmp_path / "bank.db")
    seed(db)
    hit = as_json(memrl(db, "retrieve", "warm up an egg", "--json"))
    assert hit["retrieval_id"] == 1
    before = learned_state(db)
    if transport == "stdio":
        async def over_stdio() -> None:
            async with stdio_client(stdio(db)) as (read, write), ClientSession(read, write) as session:
                await refusals(session, db)
        anyio.run(over_stdio)
    else:
        with serving("mcp", "--http", "127.0.0.1:0", "--db", db) as url:
            async def over_http() -> None:
                async with streamable_http_client(f"{url}/mcp") as (read, write), \
                        ClientSession(read, write) as session:
                    await refusals(session, db)
            anyio.run(over_http)
    after = learned_state(db)
    assert after["rewards"] == before["rewards"] == [] and after["memories"] == before["memories"]
    assert len(after["retrievals"]) == 2  # only the one retrieve that fits the contract stored a receipt


def test_the_bank_sets_the_reward_range_and_the_server_alpha(tmp_path: Any) -> None:
    """`memrl config reward_range -5 5` widens what the tools accept (schema, instructions, calls);
    `memrl mcp --alpha 0.5` is the learning rate of every reward; a bad --alpha stops the server."""
    db = str(tmp_path / "bank.db")
    seed(db)
    assert as_json(memrl(db, "config", "reward_range", "-5", "5", "--json")) == {"reward_range": [-5, 5]}
    assert "alpha must be in (0, 1]" in error_line(run_memrl("mcp", "--db", db, "--alpha", "2", ok=False))

    async def run() -> dict[str, Any]:
        async with stdio_client(stdio(db, "--alpha", "0.5")) as (read, write), ClientSession(read, write) as session:
            started = await session.initialize()
            assert "the bank accepts [-5, 5]" in started.instructions
            check_contract((await session.list_tools()).tools, (-5, 5))
            refused = await session.call_tool("reward_memories", {"memory_ids": [1], "reward": 5.5})
            assert refused.is_error and "less than or equal to 5" in refused.content[0].text
            return await call(session, "reward_memories", memory_ids=[1], reward=5)
    assert anyio.run(run) == {"updated": [{"id": 1, "q_before": 0.0, "q_after": 2.5}]}
    assert learned_state(db)["rewards"][0][4:6] == (5.0, 0.5)  # the ledger keeps R and the server's alpha


def test_read_only_instructions_and_tools_name_no_write_tool(tmp_path: Any) -> None:
    """A read-only server's instructions and tool descriptions name only the tools it offers; a full server's
    name the write tools (so the check can fail)."""
    import re

    db = str(tmp_path / "bank.db")
    seed(db)

    async def named(*extra: str) -> tuple[set[str], set[str], str]:
        async with stdio_client(stdio(db, *extra)) as (read, write), ClientSession(read, write) as session:
            started = await session.initialize()
            tools = (await session.list_tools()).tools
            text = " ".join([started.instructions or ""] + [t.description or "" for t in tools]
                            + [json.dumps(t.input_schema) for t in tools])
            return {t.name for t in tools}, set(re.findall(r"`(\w+)`", text)), text

    offered, mentioned, text = anyio.run(named, "--read-only")
    assert offered == TOOLS - WRITES and mentioned <= offered, mentioned - offered
    assert "remember" not in text and not re.search(r"\breward\b(?! range)", text), text
    offered, mentioned, _ = anyio.run(named)
    assert offered == TOOLS and {"retrieve", "reward", "remember"} <= mentioned


def test_scopes_task_ids_and_a_locked_bank(tmp_path: Any) -> None:
    """A server with `--scope user:alice`: its calls see alice's memories only (never bob's, nor the unscoped one),
    tag what they remember with her scope; a call naming bob's scope sees his alone, and its task is rewarded by
    its task id; a call cannot reward or explain another scope's receipt. A locked bank: the call fails after the
    bank wait, in one line that names no path (once "the bank the bank")."""
    import sqlite3
    import time

    db = str(tmp_path / "bank.db")
    with MemoryBank(db) as bank:
        bank.ingest("heat an egg", "ALICE: her microwave runs hot", "success", scope="user:alice")
        bank.ingest("heat an egg", "BOB: egg cups in the drawer", "success", scope="user:bob")
        bank.ingest("heat an egg", "ANYONE: microwave 30 s", "success")

    async def run() -> None:
        async with stdio_client(stdio(db, "--scope", "user:alice", "--bank-wait", "1")) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            hers = await call(session, "retrieve", query="heat an egg", k2=3)
            assert [m["id"] for m in hers["memories"]] == [1]
            his = await call(session, "retrieve", query="heat an egg", k2=3, scope="user:bob", task_id="ticket-b")
            assert [m["id"] for m in his["memories"]] == [2]
            assert (await call(session, "remember", intent="boil an egg", experience="ALICE: 7 min"))["created"]
            assert [m["id"] for m in (await call(session, "top_memories"))["memories"]] == [1, 4]
            updated = await call(session, "reward_task", task_id="ticket-b", reward=1, scope="user:bob")
            assert updated == {"updated": [{"id": 2, "q_before": 0.0, "q_after": 0.3}]}
            for tool, arguments, message in (
                    ("reward", {"retrieval_id": hers["retrieval_id"], "reward": 1, "scope": "user:bob"},
                     "retrieval 1 was retrieved in scope user:alice, not in scope user:bob"),
                    ("explain", {"retrieval_id": his["retrieval_id"]},
                     "retrieval 2 was retrieved in scope user:bob, not in scope user:alice"),
                    ("reward_task", {"task_id": "ticket-b", "reward": 1}, "no retrieval has task id 'ticket-b' in "
                                                                          "scope user:alice")):
                result = await session.call_tool(tool, arguments)
                assert result.is_error and message in result.content[0].text, (tool, result.content[0].text)
            holder = sqlite3.connect(db, isolation_level=None, timeout=30)
            holder.execute("BEGIN IMMEDIATE")
            holder.execute("INSERT INTO meta (key, value) VALUES ('held', '1')")
            try:
                began = time.monotonic()
                result = await session.call_tool("reward", {"retrieval_id": hers["retrieval_id"], "reward": 1})
                assert time.monotonic() - began < 10
            finally:
                holder.rollback()
                holder.close()
            assert result.is_error and result.content[0].text == \
                "the bank stayed locked by another writer for 1 s; try again"
            assert (await call(session, "reward", retrieval_id=hers["retrieval_id"], reward=1))["updated"]

    anyio.run(run)
    with MemoryBank(db, create=False) as bank:
        assert bank.store.memory_record(4)["scope"] == "user:alice"  # type: ignore[index]
        assert [r["scope"] for r in bank.store.recent_receipts(5)] == ["user:bob", "user:alice"]
