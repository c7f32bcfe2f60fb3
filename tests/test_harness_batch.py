"""memrl_bench.framework.batch alone, on a real bank: the retrievals before a batch plays (a seeded receipt
per training episode, none for evaluation) and its commit (rewards, new memories, MemP's revision, the
episode rows and the batch marker, all in one transaction)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from memrl_bench.framework.batch import Batch, Recalled, commit, recall
from memrl_bench.framework.config import BenchConfig
from memrl_bench.framework.protocol import Episode, Task
from memrl_bench.framework.sampling import episode_seed
from memrl_bench.framework.worker import Played
from memrl_cli.ops import runs
from memrl_cli.bank import MemoryBank
from memrl_cli.errors import MemrlError

TOY = "benchmarks.testing.toy_benchmark:Passcodes"
RUN = "run-1"
TASKS = [Task(f"train/room{r}", f"What is the passcode of room {r}?", payload=r) for r in (1, 2, 3)]


def open_run(tmp_path: Path, method: str, **settings) -> tuple[MemoryBank, BenchConfig, list[int]]:
    """A bank holding one memory per task (Q 0), a run recorded in it, and the run's config."""
    config = BenchConfig(benchmark=TOY, method=method, threshold=0.0, seed=7, **settings)
    bank = MemoryBank(str(tmp_path / "bank.db"), index="numpy")
    ids = [bank.ingest(t.query, f"the passcode of room {t.payload} may be {1000 + i}", outcome="failure",
                       task_id=t.id).id for i, t in enumerate(TASKS)]
    runs.create_run(bank, RUN, TOY, method, {}, {}, 7, "test")
    return bank, config, ids


def stored(bank: MemoryBank, memory_id: int) -> dict:
    row = bank.conn.execute("SELECT intent, experience, outcome, task_id, source, q, metadata FROM memories WHERE id = ?",
                            (memory_id,)).fetchone()
    return dict(zip(("intent", "experience", "outcome", "task_id", "source", "q", "metadata"), row))


def ledger(bank: MemoryBank) -> list[tuple]:
    return [tuple(r) for r in bank.conn.execute("SELECT retrieval_id, memory_id, reward FROM rewards ORDER BY id")]


def test_recall_retrieves_for_every_task_before_play_with_seeded_receipts(tmp_path: Path) -> None:
    bank, config, ids = open_run(tmp_path, "memrl")
    with bank:
        batch = Batch("train", "train", 2, 1, 3, TASKS)
        recalled = recall(bank, config, batch, learn=True)
        assert [r.id is not None for r in recalled.retrievals] == [True] * 3  # a receipt per training episode
        assert [r.params.seed for r in recalled.retrievals] == [episode_seed(7, "train", "train", 2, 3 + i)
                                                                for i in range(3)]
        assert [m[0]["id"] for m in recalled.memories] == ids  # each task's own memory first
        assert [len(v) for v in recalled.vectors] == [bank.dim] * 3
        receipts = bank.conn.execute("SELECT count(*) FROM retrievals").fetchone()[0]
        evaluation = recall(bank, config, replace(batch, phase="eval", split="val"), learn=False)
        assert [r.id for r in evaluation.retrievals] == [None] * 3
        assert [m[0]["id"] for m in evaluation.memories] == ids
        assert bank.conn.execute("SELECT count(*) FROM retrievals").fetchone()[0] == receipts  # none stored


def test_recall_without_retrieval_for_the_memoryless_methods_and_reflexion(tmp_path: Path) -> None:
    bank, _, ids = open_run(tmp_path, "none")
    with bank:
        batch = Batch("train", "train", 1, 0, 0, TASKS)
        none = recall(bank, BenchConfig(benchmark=TOY, method="none"), batch, learn=False)
        assert none == Recalled([None] * 3, [None] * 3, [[], [], []])
        reflexion = recall(bank, BenchConfig(benchmark=TOY, method="reflexion"), batch, learn=True)
        assert reflexion.retrievals == [None] * 3  # the task's own reflections: no retrieval, no receipt
        assert [[m["id"] for m in ms] for ms in reflexion.memories] == [[i] for i in ids]
        assert bank.conn.execute("SELECT count(*) FROM retrievals").fetchone()[0] == 0


def episode(success: bool, env_error: bool = False) -> Episode:
    return Episode(success=success, steps=1, trajectory="> answer 1234", status="PASS" if success else "FAIL",
                   env_error=env_error, info={"turns": 1})


def test_commit_rewards_receipts_stores_memories_and_marks_the_batch(tmp_path: Path) -> None:
    bank, config, ids = open_run(tmp_path, "memrl", q_init={"success": 1.0, "failure": 0.0})
    with bank:
        batch = Batch("train", "train", 2, 1, 3, TASKS)
        recalled = recall(bank, config, batch, learn=True)
        played = [Played(episode(True), "SCRIPT:\nsay 1234", {"calls": 2}),
                  Played(episode(False), "REFLECTION:\ntry 5678", {"calls": 2}),
                  Played(episode(False, env_error=True), None, {"calls": 1})]  # skip_env_errors: the worker distils nothing
        config = replace(config, skip_env_errors=True)
        rows = commit(bank, config, RUN, batch, recalled, played)
        receipts = [r.id for r in recalled.retrievals]
        injected = [[m["id"] for m in ms] for ms in recalled.memories]
        assert [r["reward"] for r in rows] == [1.0, -1.0, None]
        assert [r["retrieval_id"] for r in rows] == receipts and [r["memory_ids"] for r in rows] == injected
        assert [(r["position"], r["batch"], r["epoch"]) for r in rows] == [(3, 1, 2), (4, 1, 2), (5, 1, 2)]
        assert rows[2]["new_memory_id"] is None and rows[2]["env_error"]
        # R reached the memories each rewarded receipt selected, and nothing else
        assert sorted(ledger(bank)) == sorted([(receipts[0], m, 1.0) for m in injected[0]]
                                              + [(receipts[1], m, -1.0) for m in injected[1]])
        assert injected[0] and injected[1]
        success, failure = stored(bank, rows[0]["new_memory_id"]), stored(bank, rows[1]["new_memory_id"])
        assert (success["experience"], success["outcome"], success["q"]) == ("SCRIPT:\nsay 1234", "success", 1.0)
        assert (failure["experience"], failure["outcome"], failure["q"]) == ("REFLECTION:\ntry 5678", "failure", 0.0)
        assert success["intent"] == TASKS[0].query and success["task_id"] == TASKS[0].id
        assert success["source"] == f"run:{RUN}"
        assert json.loads(success["metadata"]) == {"run": RUN, "epoch": 2, "status": "PASS", "steps": 1,
                                                   "injected": injected[0], "turns": 1,
                                                   "episode": f"{RUN}/train/train/2/3"}  # dedup off: its own memory
        assert runs.completed_batches(bank, RUN) == {("train", "train", 2, 1)}
        assert runs.episodes(bank, RUN) == rows


def test_commit_without_utility_learning_stores_memories_and_no_reward(tmp_path: Path) -> None:
    bank, config, ids = open_run(tmp_path, "self-rag")  # a memory method that learns no Q (config.UNREWARDED)
    assert not config.learns_q
    with bank:
        batch = Batch("train", "train", 1, 0, 0, TASKS[:2])
        recalled = recall(bank, config, batch, learn=True)
        played = [Played(episode(True), "SCRIPT:\nsay 1234", {}, used=[ids[1]]),  # self-rag: the memory it used
                  Played(episode(False), "REFLECTION:\ntry 5678", {})]
        rows = commit(bank, config, RUN, batch, recalled, played)
        assert ledger(bank) == []
        assert all(r["new_memory_id"] not in ids for r in rows) and bank.count() == 5
        assert rows[0]["memory_ids"] == [ids[1]]
        assert rows[1]["memory_ids"] == [m["id"] for m in recalled.memories[1]]


def test_commit_of_memp_revises_the_top_memory_of_a_failure_in_place(tmp_path: Path) -> None:
    bank, config, ids = open_run(tmp_path, "memp")
    with bank:
        batch = Batch("train", "train", 1, 0, 0, TASKS[:2])
        recalled = recall(bank, config, batch, learn=True)
        top = recalled.memories[0][0]["id"]
        played = [Played(episode(False), "SCRIPT:\nrevised", {}), Played(episode(True), "SCRIPT:\nsay 1234", {})]
        rows = commit(bank, config, RUN, batch, recalled, played)
        assert rows[0]["new_memory_id"] == top and stored(bank, top)["experience"] == "SCRIPT:\nrevised"
        assert rows[1]["new_memory_id"] not in ids and bank.count() == 4
        assert ledger(bank) == []


def test_evaluation_commits_rows_without_memories_or_rewards(tmp_path: Path) -> None:
    bank, config, ids = open_run(tmp_path, "memrl")
    with bank:
        batch = Batch("eval", "val", 0, 0, 0, TASKS)
        recalled = recall(bank, config, batch, learn=False)
        rows = commit(bank, config, RUN, batch, recalled, [Played(episode(i == 0), None, {}) for i in range(3)])
        assert [(r["reward"], r["new_memory_id"], r["retrieval_id"]) for r in rows] == [(None, None, None)] * 3
        assert bank.count() == 3 and ledger(bank) == []
        assert runs.completed_batches(bank, RUN) == {("eval", "val", 0, 0)}


def test_a_failed_commit_writes_nothing(tmp_path: Path) -> None:
    bank, config, ids = open_run(tmp_path, "memrl")
    with bank:
        batch = Batch("train", "train", 1, 0, 0, TASKS[:2])
        recalled = recall(bank, config, batch, learn=True)
        broken = replace(recalled, vectors=[recalled.vectors[0], [0.0, 1.0]])  # the second memory cannot be stored
        played = [Played(episode(True), "SCRIPT:\nsay 1234", {}), Played(episode(False), "REFLECTION:\ntry 5678", {})]
        with pytest.raises(MemrlError, match="dimension 2"):
            commit(bank, config, RUN, batch, broken, played)
        # the first episode's reward and memory went with the second's failure
        assert bank.count() == 3 and ledger(bank) == [] and runs.completed_batches(bank, RUN) == set()
        assert all(stored(bank, i)["q"] == 0.0 for i in ids)
        commit(bank, config, RUN, batch, recalled, played)  # the same batch commits whole afterwards
        assert bank.count() == 5 and runs.completed_batches(bank, RUN) == {("train", "train", 1, 0)}
