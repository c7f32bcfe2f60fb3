"""The paper's baselines in the harness (memp, reflexion), resumed runs, and the one-command comparison,
on the passcode benchmark with a real Chat Completions server on 127.0.0.1."""

from __future__ import annotations

import importlib.util
import json
import re
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from chat_server import ScriptedChatServer
from toy_benchmark import code, responder

from benchmarks.baselines import ADJUST_SYSTEM, REFLEXION_WINDOW
from benchmarks.harness import BenchConfig, run_benchmark
from benchmarks.session import bench
from memrl_cli import inspection
from memrl_cli.bank import MemoryBank
from memrl_cli.errors import MemrlError
from memrl_cli.llm import LLMSettings

TOY = "toy_benchmark:Passcodes"
METRICS = ("accuracy", "csr", "forgetting", "eval_accuracy", "last_epoch_accuracy", "final_csr", "episodes")

PLOTS = importlib.util.find_spec("matplotlib") is not None


def agent(request: dict) -> str:
    """The toy LLM, which also knows room 1's code by heart and revises procedures faithfully."""
    messages = request["messages"]
    text = "\n".join(str(m["content"]) for m in messages)
    if messages[0]["content"] == ADJUST_SYSTEM:
        found = re.findall(r"passcode of room (\d+) is (\d+)", text)
        return f"Remember: the passcode of room {found[-1][0]} is {found[-1][1]}." if found else "Answer again."
    if messages[-1]["content"] == "What is the passcode of room 1?":
        return code(1)
    return responder(request)


def settings(server: ScriptedChatServer, **overrides: object) -> LLMSettings:
    values = dict(model="scripted", base_url=server.base_url, api_key="sk-test", retry_base_delay=0.01)
    values.update(overrides)
    return LLMSettings(**values)  # type: ignore[arg-type]


def config(method: str) -> BenchConfig:
    return BenchConfig(benchmark=TOY, method=method, epochs=3, batch_size=2, threshold=0.3, eval_splits=["val"],
                       options={"rooms": 4})


def episodes(summary: dict) -> list[dict]:
    return [json.loads(line) for line in (Path(summary["bank"]).parent / "episodes.jsonl").read_text().splitlines()]


def test_memp_keeps_only_successes_and_revises_failed_memories_in_place(tmp_path: Path):
    with ScriptedChatServer(agent) as server:
        summary = run_benchmark(config("memp"), settings(server), runs_dir=str(tmp_path), workers=0)
        adjustments = [r for r in server.requests if r["messages"][0]["content"] == ADJUST_SYSTEM]
    records = [r for r in episodes(summary) if r["phase"] == "train"]
    assert records[0]["success"] and records[0]["task_id"] == "train/room1"  # known by heart: a procedure
    failed_with_memory = [r for r in records if not r["success"] and r["memory_ids"]]
    assert failed_with_memory and adjustments
    # adjustment: the failure's write goes to the top memory it used, not to a new memory
    assert all(r["new_memory_id"] == r["memory_ids"][0] for r in failed_with_memory)
    # validation: failures without memories store nothing
    assert all(r["new_memory_id"] is None for r in records if not r["success"] and not r["memory_ids"])
    with MemoryBank(summary["bank"], create=False) as bank:
        rows = bank.conn.execute("SELECT id, outcome, q, visits, experience FROM memories").fetchall()
        assert {r[1] for r in rows} == {"success"} and {(r[2], r[3]) for r in rows} == {(0.0, 0)}  # no utility
        assert bank.conn.execute("SELECT count(*) FROM rewards").fetchone()[0] == 0
        revised = {r["new_memory_id"] for r in failed_with_memory}
        assert all("Remember: the passcode of room" in r[4] for r in rows if r[0] in revised)
        assert inspection.verify(bank)["ok"]


def stubborn(request: dict) -> str:
    """The toy LLM, except that it never learns room 1: each retry guesses by how many reflections it sees."""
    text = "\n".join(str(m["content"]) for m in request["messages"])
    if request["messages"][-1]["content"] == "What is the passcode of room 1?":
        return f"guess-{text.count('REFLECTION:')}"
    return responder(request)


def test_reflexion_uses_only_the_task_s_own_recent_reflections(tmp_path: Path):
    with ScriptedChatServer(stubborn) as server:
        summary = run_benchmark(replace(config("reflexion"), epochs=5), settings(server), runs_dir=str(tmp_path),
                                workers=0)
    # trial 2 retries rooms 2-4 with their reflection (which holds the code); room 1 never learns
    assert summary["accuracy"] == {1: 0.0, 2: 0.75, 3: 0.75, 4: 0.75, 5: 0.75}
    assert set(summary["eval_accuracy"]["val"].values()) == {0.0}  # other tasks: nothing carries over
    records = episodes(summary)
    with MemoryBank(summary["bank"], create=False) as bank:
        task_of = dict(bank.conn.execute("SELECT id, task_id FROM memories").fetchall())
        assert set(bank.conn.execute("SELECT DISTINCT outcome FROM memories").fetchall()) == {("failure",)}
        assert bank.conn.execute("SELECT count(*) FROM retrievals").fetchone()[0] == 0  # no retrieval across tasks
    train = [r for r in records if r["phase"] == "train"]
    assert all(r["memory_ids"] for r in train if r["epoch"] > 1)  # every retry sees its reflections
    room1 = sorted(m for m, t in task_of.items() if t == "train/room1")
    assert len(room1) == 4  # four failed trials with different guesses...
    last = next(r for r in train if r["task_id"] == "train/room1" and r["epoch"] == 5)
    assert last["memory_ids"] == room1[::-1][:REFLEXION_WINDOW]  # ...of which the newest few are used
    for r in records:
        assert all(task_of[m] == r["task_id"] for m in r["memory_ids"]) and len(r["memory_ids"]) <= REFLEXION_WINDOW
        assert (r["new_memory_id"] is None) == (r["success"] or r["phase"] == "eval")


def dying_server(after: int) -> ScriptedChatServer:
    count = {"n": 0}
    lock = threading.Lock()

    def respond(request: dict) -> str:
        with lock:
            count["n"] += 1
            if count["n"] == after:
                holder[0].die()
        return agent(request)

    holder = [ScriptedChatServer(respond)]
    return holder[0]


@pytest.mark.parametrize("method", ["memp", "reflexion"])
def test_baselines_resume_to_the_same_metrics(tmp_path: Path, method: str):
    with ScriptedChatServer(agent) as server:
        expected = run_benchmark(config(method), settings(server), runs_dir=str(tmp_path / "full"), workers=0)
    with dying_server(after=12) as server:
        with pytest.raises(MemrlError, match="interrupted by an LLM error"):
            run_benchmark(config(method), settings(server, max_retries=1), runs_dir=str(tmp_path / "cut"), workers=0)
    run_dir = next((tmp_path / "cut").iterdir())
    with ScriptedChatServer(agent) as server:
        got = run_benchmark(config(method), settings(server), resume=str(run_dir), workers=0)
    assert {k: got[k] for k in METRICS} == {k: expected[k] for k in METRICS}
    with MemoryBank(got["bank"], create=False) as bank, MemoryBank(expected["bank"], create=False) as full:
        def contents(b: MemoryBank) -> list[tuple]:
            return sorted(b.conn.execute("SELECT intent, experience, outcome, q FROM memories").fetchall())
        assert contents(bank) == contents(full)


def test_one_command_compares_every_method(tmp_path: Path):
    methods = ["memrl", "rag", "none", "memp", "reflexion"]
    with ScriptedChatServer(agent) as server:
        summaries = bench(TOY, ",".join(methods), {"epochs": 2, "batch_size": 2, "threshold": 0.3,
                                                   "eval_splits": ["val"]}, {"rooms": 3}, config=None,
                          llm_flags={"base_url": server.base_url, "model": "scripted"}, local_llm=False, workers=0,
                          runs_dir=str(tmp_path), resume=None, db=None, show_progress=False)
    assert [s["method"] for s in summaries] == methods
    assert len({s["bank"] for s in summaries}) == len(methods)  # every method learns in its own bank
    table = Path(summaries[0]["comparison_table"]).read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| method")]
    assert [row.split(" | ")[0].strip("| ") for row in rows] == methods
    assert "pass@k" in table and "CSR" in table
    if PLOTS:  # the plots extra draws the curves; without it the run says so and skips them
        assert Path(summaries[0]["comparison_plot"]).stat().st_size > 1000
    stored = json.loads((tmp_path / "toy_benchmark_Passcodes-comparison.json").read_text())
    assert [s["method"] for s in stored] == methods
    by_method = {s["method"]: s for s in summaries}
    assert by_method["memrl"]["accuracy"][2] == 1.0 and by_method["none"]["accuracy"][2] < 1.0
