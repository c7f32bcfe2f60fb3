"""A mini-batch's two moments with the bank: the retrievals before any of its episodes plays, and the
commit after all of them have played.

Every episode of a batch sees the bank as it was when the batch began (as in the paper): `recall`
retrieves for every task first (both phases; ε-greedy seeded by the episode's place in the stream;
a receipt per training episode). `commit` then writes, in stream order and in ONE transaction,
each receipt's reward R (+1 success / −1 failure, for the methods that learn Q), each episode's
new memory (a script if it succeeded, a reflection if not; MemP revises its top memory in place
instead), the episode rows and the batch's completion marker. A crash therefore keeps the whole
batch or none of it, and a resumed run skips exactly the committed batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memrl_bench.framework import baselines
from memrl_bench.framework.config import BenchConfig
from memrl_bench.framework.protocol import Task
from memrl_bench.framework.sampling import episode_seed
from memrl_bench.framework.worker import Played
from memrl_cli.ops import runs
from memrl_cli.bank import MemoryBank, MemoryInput, Retrieval


@dataclass(frozen=True)
class Batch:
    """One mini-batch of a run's stream: where it sits, and its tasks (stream positions `start`, `start + 1`, ...)."""

    phase: str  # "train" or "eval"
    split: str
    epoch: int
    index: int  # the batch's number within its epoch and split
    start: int
    tasks: list[Task]


@dataclass
class Recalled:
    """What a batch's episodes are shown: for each task, its query vector, its receipt and its memories."""

    vectors: list[list[float] | None]
    retrievals: list[Retrieval | None]
    memories: list[list[dict[str, Any]]]


def recall(bank: MemoryBank, config: BenchConfig, batch: Batch, learn: bool) -> Recalled:
    """The memories for every task of `batch`, retrieved before any episode plays (receipts kept when `learn`)."""
    tasks = batch.tasks
    vectors: list[list[float] | None] = [None] * len(tasks)
    retrievals: list[Retrieval | None] = [None] * len(tasks)
    memories: list[list[dict[str, Any]]] = [[] for _ in tasks]
    if config.method == "reflexion":  # the task's own reflections; no retrieval, no receipt
        memories = [baselines.reflexion_memories(bank, t.id) for t in tasks]
    elif config.uses_memory:
        vectors = [v.tolist() for v in bank.embedder.embed([t.query for t in tasks])]
        retrievals = [bank.retrieve(t.query, config.retrieve_params(
                          episode_seed(config.seed, batch.phase, batch.split, batch.epoch, batch.start + i)),
                          vector=vectors[i], record=learn)
                      for i, t in enumerate(tasks)]
        memories = [r.memories if r else [] for r in retrievals]
    return Recalled(vectors, retrievals, memories)


def commit(bank: MemoryBank, config: BenchConfig, run_id: str, batch: Batch, recalled: Recalled,
           played: list[Played]) -> list[dict[str, Any]]:
    """Rewards, new memories, episode rows and the batch marker: one transaction. Returns the episode rows."""
    c = config
    phase, epoch = batch.phase, batch.epoch
    source = f"run:{run_id}"
    rows = []
    with bank.transaction():
        for i, (task, retrieval, injected, vector, p) in enumerate(zip(batch.tasks, recalled.retrievals,
                                                                       recalled.memories, recalled.vectors, played)):
            ep = p.episode
            reward = c.success_reward if ep.success else c.failure_reward
            memory_ids = [m["id"] for m in injected] if p.used is None else p.used
            new_id = None
            if p.experience is not None and c.method == "memp" and not ep.success and memory_ids:
                bank.revise(memory_ids[0], p.experience)  # MemP's adjustment, in place
                new_id = memory_ids[0]
            elif p.experience is not None:
                if c.learns_q and retrieval and retrieval.id is not None and memory_ids:
                    bank.reward_many([{"retrieval_id": retrieval.id, "reward": reward, "alpha": c.alpha,
                                       "floor": c.q_floor, "source": source}])
                new_id = bank.ingest_many([MemoryInput(
                    intent=task.query, experience=p.experience, outcome="success" if ep.success else "failure",
                    task_id=task.id, source=source, q=c.initial_q(ep.success), vector=vector,
                    metadata={"run": run_id, "epoch": epoch, "status": ep.status, "steps": ep.steps,
                              "injected": memory_ids, **ep.info,
                              **({} if c.dedup else {"episode": f"{run_id}/{phase}/{batch.split}/{epoch}/{batch.start + i}"})},
                    )])[0].id
            rows.append({"phase": phase, "split": batch.split, "epoch": epoch, "batch": batch.index,
                         "position": batch.start + i, "task_id": task.id, "success": ep.success,
                         "reward": reward if phase == "train" and not (c.skip_env_errors and ep.env_error) else None,
                         "steps": ep.steps, "status": ep.status, "env_error": ep.env_error,
                         "retrieval_id": retrieval.id if retrieval else None, "memory_ids": memory_ids,
                         "new_memory_id": new_id, "usage": p.usage})
        runs.record_batch(bank, run_id, phase, batch.split, epoch, batch.index, rows)
    return rows
