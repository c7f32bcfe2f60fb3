"""BigCodeBench adapter: data and splits, prompt, code extraction, and real sandboxed grading.

The agent is a real scripted Chat Completions server on 127.0.0.1; programs run under bubblewrap. Tests that
play a few tasks use the sample in tests/data/bigcodebench (the first 20 tasks of the full set); tests of the
splits and of runs over whole splits need the full data (`bench_data.directory`), and skip without it.
"""

from __future__ import annotations

import dataclasses

import json
import pickle
import shutil
from pathlib import Path

import pytest

from memrl_bench.adapters.bigcodebench.benchmark import BigCodeBench, canonical_program, extract_code, format_memories
from memrl_bench.framework.protocol import Benchmark
from memrl_cli.errors import MemrlError
from memrl_bench.framework.llm import ChatClient, LLMSettings
import bench_data
from benchmarks.testing.chat_server import ScriptedChatServer

DATA = bench_data.directory("bigcodebench", "bigcodebench_full.jsonl")
needs_data = bench_data.needs("bigcodebench", DATA / "bigcodebench_full.jsonl")
SAMPLE = bench_data.BIGCODEBENCH_SAMPLE  # the first 20 tasks of bigcodebench_full.jsonl
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (apt-get install bubblewrap)")
PASSING_STDLIB_TASKS = ["BigCodeBench/1", "BigCodeBench/2", "BigCodeBench/4", "BigCodeBench/7", "BigCodeBench/19"]


def rows_by_id(subset: str = "full", where: Path = SAMPLE) -> dict[str, dict]:
    with (where / f"bigcodebench_{subset}.jsonl").open() as handle:
        return {row["task_id"]: row for row in map(json.loads, handle)}


def fenced(code: str) -> str:
    return f"Here is the solution.\n\n```python\n{code}\n```\nIt handles every case."


def play(bench: BigCodeBench, replies: dict[str, str], memories: list[dict] | None = None) -> tuple[dict, list]:
    """Play every task whose id is in `replies` (the scripted model answers by task prompt)."""
    tasks = {task.id: task for split in ("train", "val") for task in bench.tasks(split) if task.id in replies}
    by_prompt = {task.query: replies[task_id] for task_id, task in tasks.items()}

    def responder(request: dict) -> str:
        user = request["messages"][-1]["content"]
        return next(reply for prompt, reply in by_prompt.items() if prompt in user)

    with ScriptedChatServer(responder) as server:
        llm = ChatClient(LLMSettings(model="scripted-model", base_url=server.base_url, api_key="test"))
        episodes = {task_id: bench.run_episode(task, memories or [], llm) for task_id, task in tasks.items()}
        return episodes, server.requests


def test_extract_code() -> None:
    assert extract_code("a\n```python\nx = 1\n```\nb\n```python\ny = 2\n```") == "x = 1\n"
    assert extract_code("```\nz = 3\n```") == "z = 3\n"
    assert extract_code("```py\nw = 4\n```") == "w = 4\n"
    assert extract_code("```python\ncut = 5\n") == "cut = 5\n"  # reply cut at max_tokens
    assert extract_code("v = 6") == "v = 6\n"


def test_memory_block_keeps_experiences_whole() -> None:
    experience = "def task_func():\n" + "    step()\n" * 600  # far beyond the authors' 400 characters
    block = format_memories([
        {"id": 1, "intent": "Sort a list.", "experience": experience, "outcome": "success", "similarity": 0.9},
        {"id": 2, "intent": "Parse a date.", "experience": "Forgot the timezone.", "outcome": "failure",
         "similarity": 0.7},
    ])
    assert experience in block and "Forgot the timezone." in block
    assert block.index("[SUCCESS]") < block.index("[FAILURE]")
    assert format_memories([]) == ""


@needs_data
def test_splits_from_the_authors_split_files() -> None:
    full = BigCodeBench(data=str(DATA), sandbox="none")
    assert isinstance(full, Benchmark)
    train, val = full.tasks("train"), full.tasks("val")
    assert (len(train), len(val)) == (798, 342)
    assert {t.id for t in train}.isdisjoint({t.id for t in val})
    first = rows_by_id(where=DATA)[train[0].id]
    assert train[0].query == first["instruct_prompt"] and train[0].payload["test"] == first["test"]
    hard = BigCodeBench(data=str(DATA), subset="hard", split="complete", sandbox="none")
    assert (len(hard.tasks("train")), len(hard.tasks("val"))) == (103, 45)
    assert hard.tasks("val")[0].query == rows_by_id("hard", DATA)[hard.tasks("val")[0].id]["complete_prompt"]
    stdlib = BigCodeBench(data=str(DATA), stdlib_only=True, limit=3, sandbox="none")
    assert len(stdlib.tasks("train")) == 3
    assert len(stdlib._splits["train"]) + len(stdlib._splits["val"]) == 327
    with pytest.raises(MemrlError, match="unknown split"):
        full.tasks("test")
    assert pickle.loads(pickle.dumps(stdlib)).tasks("train") == stdlib.tasks("train")


def test_seeded_split_without_split_file(tmp_path: Path) -> None:
    rows = list(rows_by_id().values())[:20]
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    bench = BigCodeBench(data=str(data), sandbox="none")
    train, val = [t.id for t in bench.tasks("train")], [t.id for t in bench.tasks("val")]
    assert (len(train), len(val)) == (14, 6) and sorted(train + val) == sorted(r["task_id"] for r in rows)
    assert train == [t.id for t in BigCodeBench(data=str(data), sandbox="none").tasks("train")]
    assert train != [t.id for t in BigCodeBench(data=str(data), sandbox="none", seed=7).tasks("train")]


def test_data_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(MemrlError, match="not found"):
        BigCodeBench(data=str(tmp_path / "missing.jsonl"), sandbox="none")
    monkeypatch.delenv("BIGCODEBENCH_DATA", raising=False)  # no data where the adapter looks
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(MemrlError, match="--data PATH.*bigcode/bigcodebench"):
        BigCodeBench(sandbox="none")
    with pytest.raises(MemrlError, match="unknown bigcodebench option"):
        BigCodeBench(data=str(tmp_path), sandbox="none", retries=3)


@needs_bwrap
def test_canonical_solutions_pass_and_bad_code_is_graded() -> None:
    rows = rows_by_id()
    bench = BigCodeBench(data=str(SAMPLE), stdlib_only=True, timeout=3)
    replies = {task_id: fenced(canonical_program(rows[task_id])) for task_id in PASSING_STDLIB_TASKS}
    program = rows["BigCodeBench/1"]["code_prompt"]  # imports + `def task_func(length=100):`
    broken = "BigCodeBench/0"  # each remaining case gets its own task, so one run plays them all
    replies[broken] = fenced(rows[broken]["code_prompt"] + "    return None\n")
    replies["BigCodeBench/5"] = fenced("def task_func(:\n    pass")
    replies["BigCodeBench/8"] = fenced("def task_func(*args, **kwargs):\n    while True:\n        pass")
    replies["BigCodeBench/12"] = fenced("import some_missing_lib\n\n" + program + "    return some_missing_lib.go()")
    replies["BigCodeBench/13"] = fenced("raise RuntimeError('boom at import')\n")
    memories = [{"id": 1, "intent": "Count letters.", "experience": "MEMORY-EXPERIENCE " * 200,
                 "outcome": "success", "similarity": 0.8, "q": 0.5, "score": 1.0}]
    episodes, requests = play(bench, replies, memories)

    for task_id in PASSING_STDLIB_TASKS:
        episode = episodes[task_id]
        assert (episode.status, episode.success, episode.steps, episode.env_error) == ("PASS", True, 1, False)
        assert episode.trajectory.startswith(f"Task: {task_id}\n") and "Evaluation: PASS" in episode.trajectory
        assert rows[task_id]["canonical_solution"].strip() in episode.trajectory
    expected = {broken: "FAIL", "BigCodeBench/5": "SYNTAX_ERROR", "BigCodeBench/8": "TIMEOUT",
                "BigCodeBench/12": "MISSING_LIBRARY", "BigCodeBench/13": "RUNTIME_ERROR"}
    assert {task_id: episodes[task_id].status for task_id in expected} == expected
    assert not any(episodes[task_id].success for task_id in expected)
    assert [task_id for task_id in expected if episodes[task_id].env_error] == []  # the program chose that import
    assert episodes["BigCodeBench/12"].info["missing_module"] == "some_missing_lib"
    assert episodes["BigCodeBench/12"].info["module_required_by_task"] is False
    task = next(t for t in bench.tasks(bench.train_split) + bench.tasks(bench.eval_splits[0]) if t.id == "BigCodeBench/12")
    needing = dataclasses.replace(task, payload={**task.payload, "libs": [*task.payload["libs"], "some_missing_lib"]})
    assert bench.grade(needing, replies["BigCodeBench/12"], None).env_error  # type: ignore[arg-type]
    assert "boom at import" in episodes["BigCodeBench/13"].trajectory
    assert "tests failed" in episodes[broken].trajectory

    system = requests[0]["messages"][0]
    assert system["role"] == "system" and "expert Python programmer" in system["content"]
    assert "MEMORY-EXPERIENCE " * 200 in system["content"]  # the whole experience, never cut


@needs_bwrap
def test_complete_prompt_split_plays_the_completion_prompt() -> None:
    rows = rows_by_id()
    bench = BigCodeBench(data=str(SAMPLE), split="complete", stdlib_only=True)
    task_id = PASSING_STDLIB_TASKS[0]
    episodes, requests = play(bench, {task_id: fenced(rows[task_id]["code_prompt"] + rows[task_id]["canonical_solution"])})
    assert episodes[task_id].status == "PASS"
    assert rows[task_id]["complete_prompt"] in requests[0]["messages"][-1]["content"]


@pytest.mark.slow
@needs_data
@needs_bwrap
def test_bench_bigcodebench_through_the_harness(tmp_path: Path) -> None:
    """Two epochs of `run_benchmark`: canonical replies pass, every episode becomes a memory and is rewarded."""
    from benchmarks.testing.chat_server import distilling

    from memrl_bench.framework.config import BenchConfig
    from memrl_bench.framework.harness import run_benchmark
    from memrl_cli.bank import MemoryBank
    from memrl_cli.ops.inspection import verify

    rows = rows_by_id(where=DATA)
    bench = BigCodeBench(data=str(DATA), stdlib_only=True, sandbox="none")  # the harness samples 2 of each split
    tasks = bench.tasks("train") + bench.tasks("val")
    replies = {t.query: fenced(canonical_program(rows[t.id])) for t in tasks}

    def agent(request: dict) -> str:
        return replies[request["messages"][-1]["content"]]  # the instruct prompt is the whole user message

    with ScriptedChatServer(distilling(agent)) as server:
        # seed 1 samples tasks whose canonical solutions pass here (seed 0's BigCodeBench/195 times out)
        config = BenchConfig(benchmark="bigcodebench", epochs=2, batch_size=2, limit=2, seed=1, data=str(DATA),
                             eval_splits=["val"], eval_limit=2, options={"stdlib_only": True, "timeout": 30})
        summary = run_benchmark(config, LLMSettings(model="scripted", base_url=server.base_url, api_key="test"),
                                runs_dir=str(tmp_path), workers=0)
    assert summary["accuracy"] == {1: 1.0, 2: 1.0} and summary["episodes"] == 2 * 2 + 3 * 2
    with MemoryBank(summary["bank"], create=False) as bank:
        assert bank.count() == 4 and verify(bank)["ok"]  # a memory per episode (the paper), even when epoch 2 repeats epoch 1
        assert bank.conn.execute("SELECT count(*) FROM rewards WHERE reward = 1").fetchone()[0] >= 2


@pytest.mark.slow
@needs_data
@needs_bwrap
def test_self_rag_on_bigcodebench_through_the_harness(tmp_path: Path) -> None:
    """BigCodeBench is a single generation, so self-rag applies: relevance per memory, one graded program."""
    from benchmarks.testing.chat_server import distilling

    from memrl_bench.framework.config import BenchConfig
    from memrl_bench.framework.harness import run_benchmark
    from memrl_bench.framework.self_rag import ISREL_SYSTEM, ISSUP_SYSTEM, ISUSE_SYSTEM, RETRIEVE_SYSTEM
    from memrl_cli.bank import MemoryBank

    rows = rows_by_id(where=DATA)
    bench = BigCodeBench(data=str(DATA), stdlib_only=True, sandbox="none")
    tasks = bench.tasks("train") + bench.tasks("val")
    replies = {t.query: fenced(canonical_program(rows[t.id])) for t in tasks}
    verdicts = {RETRIEVE_SYSTEM: "Yes", ISSUP_SYSTEM: "Fully supported", ISUSE_SYSTEM: "5"}

    def agent(request: dict) -> str:
        system, user = request["messages"][0]["content"], request["messages"][-1]["content"]
        if system == ISREL_SYSTEM:  # relevant: a note left by the same task
            task, _, note = user.partition("\n\nNote (from a past episode on: ")
            return "Relevant" if note.startswith(task.removeprefix("Task:\n") + "):") else "Irrelevant"
        return verdicts.get(system) or replies[user]

    with ScriptedChatServer(distilling(agent)) as server:
        config = BenchConfig(benchmark="bigcodebench", method="self-rag", epochs=2, batch_size=2, limit=2, seed=1,
                             data=str(DATA), options={"stdlib_only": True, "timeout": 30})
        summary = run_benchmark(config, LLMSettings(model="scripted", base_url=server.base_url, api_key="test"),
                                runs_dir=str(tmp_path), workers=0)
        systems = [r["messages"][0]["content"] for r in server.requests]
    assert summary["accuracy"] == {1: 1.0, 2: 1.0}
    assert systems.count(RETRIEVE_SYSTEM) >= 2 and systems.count(ISREL_SYSTEM) >= 2
    with MemoryBank(summary["bank"], create=False) as bank:
        task_of = dict(bank.conn.execute("SELECT id, task_id FROM memories").fetchall())
        assert bank.conn.execute("SELECT count(*) FROM rewards").fetchone()[0] == 0
    log = Path(summary["bank"]).parent / "episodes.jsonl"
    second = [r for r in map(json.loads, log.read_text().splitlines()) if r["epoch"] == 2]
    assert [[task_of[m] for m in r["memory_ids"]] for r in second] == [[r["task_id"]] for r in second]


@needs_data
@pytest.mark.parametrize("subset", ["full", "hard"])
def test_without_a_split_file_the_authors_split_is_reproduced(tmp_path: Path, subset: str) -> None:
    """No split file (e.g. data from Hugging Face): the seeded fallback is MemRL's own split, id for id."""
    (tmp_path / f"bigcodebench_{subset}.jsonl").symlink_to(DATA / f"bigcodebench_{subset}.jsonl")
    bench = BigCodeBench(data=str(tmp_path), subset=subset, sandbox="none")
    spec = json.loads(next(DATA.glob(f"split_{subset}_seed*.json")).read_text())
    assert set(bench._splits["train"]) == set(spec["train_ids"]) and set(bench._splits["val"]) == set(spec["val_ids"])


@needs_bwrap
def test_zero_tests_is_never_a_pass_and_subtests_count() -> None:
    bench = BigCodeBench(data=str(SAMPLE), timeout=20)
    subtests = ("import unittest\nclass TestCases(unittest.TestCase):\n    def test_a(self):\n"
                "        for i in range(3):\n            with self.subTest(i=i):\n"
                "                self.assertEqual(task_func(i), i)\n")
    assert bench.evaluate("def task_func(x):\n    return x\n", subtests).status == "PASS"
    assert bench.evaluate("def task_func(x):\n    return 1\n", subtests).status == "FAIL"
    empty = "import unittest\nclass TestCases(unittest.TestCase):\n    pass\n"
    verdict = bench.evaluate("def task_func(x):\n    return x\n", empty)
    assert verdict.status == "RUNTIME_ERROR" and "0 tests is never a pass" in verdict.detail
