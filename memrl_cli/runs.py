"""Benchmark runs recorded in the bank: config, models, seed, code version, and per-episode rows.

A mini-batch's episodes, its rewards and its new memories are committed in one transaction
together with a `run_batches` marker, so the bank is the run's checkpoint: a resumed run skips
exactly the batches that were committed.
"""

from __future__ import annotations

import json
from typing import Any

from memrl_cli.bank import MemoryBank, now
from memrl_cli.errors import MemrlError

EPISODE_FIELDS = ("phase", "split", "epoch", "batch", "position", "task_id", "success", "reward", "steps", "status",
                  "env_error", "retrieval_id", "memory_ids", "new_memory_id", "usage")


def create_run(bank: MemoryBank, run_id: str, benchmark: str, method: str, config: dict[str, Any],
               models: dict[str, Any], seed: int | None, code_version: str) -> None:
    """Record a new run."""
    stamp = now()
    with bank.transaction() as conn:
        conn.execute("INSERT INTO runs (id, benchmark, method, config, models, seed, code_version, created_at, "
                     "updated_at) VALUES (?,?,?,?,?,?,?,?,?)",
                     (run_id, benchmark, method, json.dumps(config), json.dumps(models), seed, code_version, stamp,
                      stamp))


def has_run(bank: MemoryBank, run_id: str) -> bool:
    """Whether the bank has recorded this run."""
    return bank.conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is not None


def get_run(bank: MemoryBank, run_id: str) -> dict[str, Any]:
    """A run's row with its config decoded; MemrlError if unknown."""
    row = bank.conn.execute("SELECT id, benchmark, method, config, models, seed, code_version, status, created_at "
                            "FROM runs WHERE id = ?", (run_id,)).fetchone()
    if row is None:
        raise MemrlError(f"no run {run_id!r} in {bank.path}")
    run = dict(zip(("id", "benchmark", "method", "config", "models", "seed", "code_version", "status", "created_at"), row))
    run["config"], run["models"] = json.loads(run["config"]), json.loads(run["models"])
    return run


def set_status(bank: MemoryBank, run_id: str, status: str) -> None:
    """Mark a run running, finished or failed."""
    with bank.transaction() as conn:
        conn.execute("UPDATE runs SET status = ?, updated_at = ? WHERE id = ?", (status, now(), run_id))


def completed_batches(bank: MemoryBank, run_id: str) -> set[tuple[str, str, int, int]]:
    """(phase, split, epoch, batch) of every committed mini-batch."""
    return {tuple(r) for r in bank.conn.execute(  # type: ignore[misc]
        "SELECT phase, split, epoch, batch FROM run_batches WHERE run_id = ?", (run_id,))}


def record_batch(bank: MemoryBank, run_id: str, phase: str, split: str, epoch: int, batch: int,
                 episodes: list[dict[str, Any]]) -> None:
    """Write a batch's episode rows and its completion marker (inside the caller's transaction)."""
    stamp = now()
    with bank.transaction() as conn:
        conn.executemany(
            f"INSERT INTO episodes (run_id, {', '.join(EPISODE_FIELDS)}, created_at) "
            f"VALUES (?, {', '.join('?' * len(EPISODE_FIELDS))}, ?)",
            [(run_id, *[json.dumps(e[f]) if f in ("memory_ids", "usage") else
                        int(e[f]) if isinstance(e[f], bool) else e[f] for f in EPISODE_FIELDS], stamp)
             for e in episodes])
        conn.execute("INSERT INTO run_batches (run_id, phase, split, epoch, batch, completed_at) VALUES (?,?,?,?,?,?)",
                     (run_id, phase, split, epoch, batch, stamp))
        conn.execute("UPDATE runs SET updated_at = ? WHERE id = ?", (stamp, run_id))


def episodes(bank: MemoryBank, run_id: str) -> list[dict[str, Any]]:
    """Every committed episode of a run, in play order."""
    rows = bank.conn.execute(f"SELECT {', '.join(EPISODE_FIELDS)} FROM episodes WHERE run_id = ? ORDER BY id",
                             (run_id,)).fetchall()
    out = []
    for row in rows:
        e = dict(zip(EPISODE_FIELDS, row))
        e["memory_ids"], e["usage"] = json.loads(e["memory_ids"]), json.loads(e["usage"])
        e["success"], e["env_error"] = bool(e["success"]), bool(e["env_error"])
        out.append(e)
    return out
