"""The bank's reward range through the CLI and the proxy (the MCP tools: tests/test_mcp.py; the Ledger and
the Python API: tests/test_ledger.py): [-1, 1] by default, `memrl config reward_range` widens it, and a
reward outside is one error line with nothing written."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx2
import pytest
from conftest import error_line
from served import learned_state, seed, serving
from test_cli import as_json, memrl

OUTSIDE = "reward must be in [-1, 1] (the bank's reward range), got 5"


@pytest.mark.slow
def test_the_cli_keeps_rewards_in_the_bank_s_range(bank_at: Callable[[str], str]) -> None:
    db = bank_at("bank")
    seed(db)
    rid = str(as_json(memrl(db, "retrieve", "warm up an egg", "--json"))["retrieval_id"])
    before = learned_state(db)
    assert error_line(memrl(db, "reward", "--retrieval", rid, "--reward", "5", ok=False)) == f"memrl: error: {OUTSIDE}"
    assert json.loads(memrl(db, "reward", "--memory", "1", "--reward", "-1.5", "--json", ok=False).stdout)["error"][
        "message"] == "reward must be in [-1, 1] (the bank's reward range), got -1.5"
    jsonl = '{"memory_ids": [1], "reward": 1}\n{"retrieval_id": %s, "reward": 5}\n' % rid
    assert f"reward 2: {OUTSIDE}" in error_line(memrl(db, "reward", "--jsonl", "-", stdin=jsonl, ok=False))
    assert learned_state(db) == before  # nothing written

    assert as_json(memrl(db, "config", "--json")) == {"reward_range": [-1, 1]}
    assert memrl(db, "config", "reward_range", "-5", "5").stdout == "reward_range -5 5\n"
    assert as_json(memrl(db, "inspect", "--stats", "--json"))["reward_range"] == [-5, 5]
    assert as_json(memrl(db, "reward", "--retrieval", rid, "--reward", "5", "--json"))["updated"][0]["q_after"] == 1.5
    assert as_json(memrl(db, "config", "reward_range", "--reset", "--json")) == {"reward_range": [-1, 1]}
    assert OUTSIDE in error_line(memrl(db, "reward", "--memory", "2", "--reward", "5", ok=False))
    for args, message in ((["nope"], "unknown setting 'nope'; the bank's settings: reward_range"),
                          (["reward_range", "1"], "reward_range takes two numbers, MIN MAX; got 1"),
                          (["reward_range", "low", "high"], "reward_range takes two numbers, MIN MAX; got low high"),
                          (["reward_range", "5", "-5"], "a reward range is two finite numbers MIN < MAX"),
                          (["reward_range", "-1", "1", "--reset"], "give MIN MAX, or --reset, not both"),
                          (["--reset"], "name the setting to change")):
        assert message in error_line(memrl(db, "config", *args, ok=False)), args
    assert as_json(memrl(db, "config", "--json")) == {"reward_range": [-1, 1]}


def test_the_proxy_keeps_rewards_in_the_bank_s_range(tmp_path: Any) -> None:
    """A running proxy follows the bank's range as it changes (no restart)."""
    db = str(tmp_path / "bank.db")
    seed(db)
    before = learned_state(db)
    with serving("proxy", "--upstream", "http://127.0.0.1:9", "--port", "0", "--db", db) as url:
        refused = httpx2.post(f"{url}/v1/memrl/rewards", json=[{"memory_ids": [1], "reward": 1},
                                                                {"memory_ids": [2], "reward": 5}])
        assert refused.status_code == 400 and refused.json()["error"]["message"] == f"reward 2: {OUTSIDE}"
        assert learned_state(db) == before
        memrl(db, "config", "reward_range", "-5", "5")
        done = httpx2.post(f"{url}/v1/memrl/rewards", json={"memory_ids": [2], "reward": 5})
        assert done.status_code == 200 and done.json() == {"updated": [{"id": 2, "q_before": 0.0, "q_after": 1.5}]}
