"""Benchmark runs recorded in the bank: config, models, seed, code version, and per-episode rows.

A mini-batch's episodes, its rewards and its new memories are committed in one transaction
together with a `run_batches` marker, so the bank is the run's checkpoint: a resumed run skips
exactly the batches that were committed.

The run tables are the harness's own (`schema.RUNS`, versioned by the meta value `schema:runs`):
`create_run` creates them when a run first opens the bank, so a bank only ever used by `memrl
ingest`/`retrieve` has none, and reading runs from such a bank finds none.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memrl_cli.bank.memory_bank import MemoryBank
from memrl_cli.bank.records import now
from memrl_cli.errors import MemrlError
from memrl_cli.store.migrations import RUNS

EPISODE_FIELDS = ("phase", "split", "epoch", "batch", "position", "task_id", "success", "reward", "steps", "status",
                  "env_error", "retrieval_id", "memory_ids", "new_memory_id", "usage")


def run_directory(run_dir: str | Path) -> tuple[dict[str, Any], str]:
    """A run directory's config.json and its bank's location: the run's own `bank.db` in the directory when the
    run kept its bank there (the default: so a run directory that was moved, copied or handed to another
    machine carries its bank), else the location the run was given."""
    try:
        stored = json.loads((Path(run_dir) / "config.json").read_text())
        bank = str(stored["bank"])
        own = Path(bank).name == "bank.db" and Path(bank).parent.name == str(stored["run_id"])
    except (OSError, ValueError, KeyError, TypeError):
        raise MemrlError(f"{run_dir} is not a run directory (no readable config.json)") from None
    return stored, str(Path(run_dir) / "bank.db") if own else bank


def has_runs(bank: MemoryBank) -> bool:
    """Whether the bank has the run tables (a run has opened it)."""
    return bank.store.migrated_to(RUNS) > 0


def create_run(bank: MemoryBank, run_id: str, benchmark: str, method: str, config: dict[str, Any],
               models: dict[str, Any], seed: int | None, code_version: str) -> None:
    """Record a new run (creating or updating the run tables first)."""
    with bank.transaction():
        bank.store.migrate_set(RUNS)
        bank.store.insert_run(run_id, benchmark, method, json.dumps(config), json.dumps(models), seed, code_version,
                              now())


def has_run(bank: MemoryBank, run_id: str) -> bool:
    """Whether the bank has recorded this run."""
    return has_runs(bank) and bank.store.run_record(run_id) is not None


def get_run(bank: MemoryBank, run_id: str) -> dict[str, Any]:
    """A run's row with its config decoded; MemrlError if unknown."""
    run = bank.store.run_record(run_id) if has_runs(bank) else None
    if run is None:
        suffix = "" if has_runs(bank) else " (no benchmark run has used this bank)"
        raise MemrlError(f"no run {run_id!r} in {bank.path}{suffix}")
    run["config"], run["models"] = json.loads(run["config"]), json.loads(run["models"])
    return run


def set_status(bank: MemoryBank, run_id: str, status: str) -> None:
    """Mark a run running, finished or failed."""
    with bank.transaction():
        bank.store.set_run_status(run_id, status, now())


def completed_batches(bank: MemoryBank, run_id: str) -> set[tuple[str, str, int, int]]:
    """(phase, split, epoch, batch) of every committed mini-batch."""
    return bank.store.committed_batches(run_id) if has_runs(bank) else set()


def record_batch(bank: MemoryBank, run_id: str, phase: str, split: str, epoch: int, batch: int,
                 episodes: list[dict[str, Any]]) -> None:
    """Write a batch's episode rows and its completion marker (inside the caller's transaction)."""
    with bank.transaction():
        bank.store.insert_batch(run_id, (phase, split, epoch, batch), EPISODE_FIELDS, [
            tuple(json.dumps(e[f]) if f in ("memory_ids", "usage") else int(e[f]) if isinstance(e[f], bool) else e[f]
                  for f in EPISODE_FIELDS) for e in episodes], now())


def episodes(bank: MemoryBank, run_id: str) -> list[dict[str, Any]]:
    """Every committed episode of a run, in play order."""
    out = bank.store.episode_rows(run_id, EPISODE_FIELDS) if has_runs(bank) else []
    for e in out:
        e["memory_ids"], e["usage"] = json.loads(e["memory_ids"]), json.loads(e["usage"])
        e["success"], e["env_error"] = bool(e["success"]), bool(e["env_error"])
    return out
