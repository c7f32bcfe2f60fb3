"""The paper's baselines in the harness (memp, reflexion), resumed runs, and the one-command comparison,
on the passcode benchmark with a real Chat Completions server on 127.0.0.1."""

from __future__ import annotations

import importlib.util
import io
import json
import re
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from benchmarks.testing.chat_server import ScriptedChatServer
from benchmarks.testing.toy_benchmark import code, responder

from memrl_bench.framework.baselines import ADJUST_SYSTEM, REFLEXION_WINDOW
from memrl_bench.framework.config import BenchConfig
from memrl_bench.framework.harness import run_benchmark
from memrl_bench.framework.reports import comparison_table, progress_printer
from memrl_bench.framework.self_rag import ISREL_SYSTEM, ISSUP_SYSTEM, ISUSE_SYSTEM, RETRIEVE_SYSTEM
from memrl_bench.framework.session import bench
from memrl_cli.ops import inspection
from memrl_cli.bank import MemoryBank, MemoryInput
from memrl_cli.errors import MemrlError
from memrl_bench.framework.experience import REFLECTION_SYSTEM, SCRIPT_SYSTEM
from memrl_bench.framework.llm import LLMSettings

TOY = "benchmarks.testing.toy_benchmark:Passcodes"
METRICS = ("accuracy", "csr", "forgetting", "eval_accuracy", "last_epoch_accuracy", "final_csr", "episodes")

PLOTS = importlib.util.find_spec("matplotlib") is not None


def critic(request: dict) -> str | None:
    """Self-RAG's judgements, as a careful model would make them on the toy benchmark (None: not a critique).

    Room 1 it knows by heart (no retrieval); a note is relevant when it is about the task's room; an
    answer is fully supported by a note that states it, partially by one that only guesses it."""
    system, user = request["messages"][0]["content"], str(request["messages"][-1]["content"])
    room = re.search(r"room (\d+)", user.partition("\n\nNote")[0])
    note = user.partition("\n\nAnswer:")[0]
    if system == RETRIEVE_SYSTEM:
        return "No." if room and room.group(1) == "1" else "Yes"
    if system == ISREL_SYSTEM:
        return "Relevant" if room and re.search(rf"room {room.group(1)}\b", note.partition("Note")[2]) else "Irrelevant"
    if system == ISSUP_SYSTEM:
        answer = user.rpartition("Answer:\n")[2].strip()
        return ("No support" if answer not in note else "Partially supported" if "guess" in note
                else "Fully supported")
    if system == ISUSE_SYSTEM:
        return "5" if user.rpartition("Answer:\n")[2].strip().isdigit() else "1"
    return None


def agent(request: dict) -> str:
    """The toy LLM, which also knows room 1's code by heart, revises procedures faithfully and critiques."""
    messages = request["messages"]
    text = "\n".join(str(m["content"]) for m in messages)
    judgement = critic(request)
    if judgement is not None:
        return judgement
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
    assert len(room1) == 5  # every failed trial is a memory (the paper; the `dedup` switch would keep repeats once)...
    last = next(r for r in train if r["task_id"] == "train/room1" and r["epoch"] == 5)
    assert last["memory_ids"] == room1[:4][::-1][:REFLEXION_WINDOW]  # ...of which the newest few before it are used
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


@pytest.mark.parametrize("method", [pytest.param("rag", marks=pytest.mark.slow),  # memrl's code path (tested by default
                                    pytest.param("none", marks=pytest.mark.slow),  # in test_reasoning_models)
                                    "memp", "reflexion", "self-rag", "pass@k"])
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


@pytest.mark.slow
def test_one_command_compares_every_method(tmp_path: Path):
    methods = ["memrl", "rag", "none", "memp", "reflexion", "self-rag", "pass@k"]
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
    cells = {row.split(" | ")[0].strip("| "): row.split(" | ") for row in rows}
    assert cells["pass@k"][-4] == cells["pass@k"][-5] != "–" and cells["self-rag"][-4] == "–"  # pass@k = its CSR
    if PLOTS:  # the plots extra draws the curves; without it the run says so and skips them
        assert Path(summaries[0]["comparison_plot"]).stat().st_size > 1000
    stored = json.loads((tmp_path / f"{TOY.replace(':', '_')}-comparison.json").read_text())
    assert [s["method"] for s in stored] == methods
    by_method = {s["method"]: s for s in summaries}
    assert by_method["memrl"]["accuracy"][2] == 1.0 and by_method["none"]["accuracy"][2] < 1.0


GUESS = "REFLECTION:\nI guess the passcode of room 2 is 1234.\n\nTRAJECTORY:\n> answer 1234"


def test_self_rag_retrieves_on_demand_keeps_relevant_memories_and_answers_with_the_best_critiqued_one(tmp_path: Path):
    bank_path = str(tmp_path / "bank.db")
    with MemoryBank(bank_path) as bank:  # a misleading note: relevant to room 2, but only a guess
        guess = bank.ingest_many([MemoryInput(intent="What is the passcode of room 2?", experience=GUESS,
                                              outcome="failure", task_id="train/room2", source="seed")])[0].id
    with ScriptedChatServer(agent) as server:
        summary = run_benchmark(config("self-rag"), settings(server), bank_path=bank_path, runs_dir=str(tmp_path),
                                workers=0)
        requests = server.requests
    # room 1 is known by heart ([Retrieve] No); room 2 first follows the only relevant note, the guess (wrong),
    # then has the guess and its reflection: the critique prefers the reflection's fully supported answer
    assert summary["accuracy"] == {1: 0.25, 2: 1.0, 3: 1.0}
    log = tmp_path / summary["run_id"] / "episodes.jsonl"
    records = [r for r in map(json.loads, log.read_text().splitlines()) if r["phase"] == "train"]
    with MemoryBank(bank_path, create=False) as bank:
        rows = bank.conn.execute("SELECT id, task_id, metadata, q, visits FROM memories").fetchall()
        assert bank.conn.execute("SELECT count(*) FROM rewards").fetchone()[0] == 0  # no utility learned
        assert inspection.verify(bank)["ok"]
    task_of = {r[0]: r[1] for r in rows}
    trace = {r[0]: json.loads(r[2]).get("self_rag") for r in rows}
    assert {(r[3], r[4]) for r in rows} == {(0.0, 0)}
    for r in records:  # an answer uses at most one memory, always one of the task's own room
        assert len(r["memory_ids"]) <= 1 and all(task_of[m] == r["task_id"] for m in r["memory_ids"])
        assert r["new_memory_id"] is not None  # every episode is stored, as rag does
        t = trace[r["new_memory_id"]]
        assert t["retrieve"] == (r["task_id"] != "train/room1" and r["retrieval_id"] is not None)
        assert all(task_of[m] == r["task_id"] for m in t["relevant"])
        assert r["memory_ids"] == ([t["chosen"]] if t["chosen"] is not None else [])
    room2 = {r["epoch"]: r for r in records if r["task_id"] == "train/room2"}
    assert room2[1]["memory_ids"] == [guess] and not room2[1]["success"]
    second = trace[room2[2]["new_memory_id"]]
    assert sorted(second["relevant"]) == sorted([guess, room2[1]["new_memory_id"]])
    assert second["scores"] == {str(guess): 1.0, str(room2[1]["new_memory_id"]): 1.5}  # 1·s(IsSup) + 0.5·s(IsUse)
    assert room2[2]["memory_ids"] == [room2[1]["new_memory_id"]] and room2[2]["success"]
    # the model was asked about room 1 once per episode ([Retrieve]) and never judged a memory for it
    judged = [r for r in requests if r["messages"][0]["content"] == ISREL_SYSTEM]
    assert judged and not any("room 1?" in r["messages"][-1]["content"].partition("\n\nNote")[0] for r in judged)
    assert all("temperature" not in r for r in requests)


def test_self_rag_refuses_a_multi_step_benchmark_before_writing_anything(tmp_path: Path):
    pytest.importorskip("alfworld")
    with pytest.raises(MemrlError, match="self-rag does not apply to alfworld: .*one LLM generation"):
        bench("alfworld", "memrl,self-rag", {"epochs": 1}, {}, config=None,
              llm_flags={"base_url": "http://127.0.0.1:9/v1", "model": "m"}, local_llm=False, workers=0,
              runs_dir=str(tmp_path / "runs"), resume=None, db=None, show_progress=False)
    assert not (tmp_path / "runs").exists()
    with pytest.raises(MemrlError, match="self-rag does not apply to benchmarks.learning.synthetic:Synthetic"):
        run_benchmark(BenchConfig(benchmark="benchmarks.learning.synthetic:Synthetic", method="self-rag"),
                      LLMSettings(model="m", base_url="http://127.0.0.1:9/v1", api_key="k"),
                      runs_dir=str(tmp_path / "runs"), workers=0)
    assert not (tmp_path / "runs").exists()


def test_pass_at_k_retries_only_unsolved_tasks_without_memory(tmp_path: Path):
    with ScriptedChatServer(agent) as server:
        summary = run_benchmark(config("pass@k"), settings(server), runs_dir=str(tmp_path), workers=0)
        requests = server.requests
    train = [r for r in episodes(summary) if r["phase"] == "train"]
    # room 1 (known by heart) is solved in try 1 and never replayed; rooms 2-4 are retried, never with memory
    assert [sum(1 for r in train if r["epoch"] == e) for e in (1, 2, 3)] == [4, 3, 3]
    assert [r["task_id"] for r in train if r["epoch"] > 1 and r["task_id"] == "train/room1"] == []
    assert summary["csr"] == {1: 0.25, 2: 0.25, 3: 0.25} and summary["final_csr"] == 0.25  # pass@1..pass@3
    assert all(not r["memory_ids"] and r["new_memory_id"] is None for r in episodes(summary))
    assert not any(r["messages"][0]["content"] in (SCRIPT_SYSTEM, REFLECTION_SYSTEM) for r in requests)
    with MemoryBank(summary["bank"], create=False) as bank:
        assert bank.count() == 0
    with ScriptedChatServer(agent) as server:  # only room 1: solved at once, nothing left to retry
        solved = run_benchmark(replace(config("pass@k"), options={"rooms": 1}, eval_splits=[]), settings(server),
                               runs_dir=str(tmp_path), workers=0, on_progress=progress_printer(lines := io.StringIO()))
    assert solved["epochs"] == [1] and solved["final_csr"] == 1.0
    assert "epoch 2: nothing to play (every training task already solved)" in lines.getvalue()
    row = comparison_table([summary, solved]).splitlines()[-1]
    assert row.split(" | ")[:4] == ["| pass@k", "1.000", "–", "–"]
