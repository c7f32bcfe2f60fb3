"""The learning report of a benchmark run, computed from its receipts and reward ledger.

A memory *proved useful* for a task when a retrieval made for one of that task's training
episodes selected it and the ledger rewarded that retrieval positively (R > 0: the episode
succeeded with the memory in its prompt). For every training episode the report asks, about
the memories that proved useful for its task anywhere in the run:

* **existed**: was one of them in the bank when the episode's retrieval ran?
* **recalled**: was one of them among the retrieval's Phase-A candidates?
* **selected**: was one of them among the memories Phase B selected (injected)?

Counted per epoch, the three figures show where learning stalls: a useful memory that exists
but is not recalled points at Phase A (e.g. a frozen candidate set), one recalled but not
selected at Phase B's scoring.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memrl_cli import runs
from memrl_cli.bank import MemoryBank
from memrl_cli.errors import MemrlError

EPOCH_FIELDS = ("epoch", "episodes", "successes", "accuracy", "receipts", "existed", "recalled", "selected")


def run_location(run_dir: str | Path) -> tuple[str, str]:
    """(run id, bank location) from a run directory's config.json."""
    try:
        stored = json.loads((Path(run_dir) / "config.json").read_text())
        return str(stored["run_id"]), str(stored["bank"])
    except (OSError, ValueError, KeyError, TypeError):
        raise MemrlError(f"{run_dir} is not a run directory (no readable config.json)") from None


def learning_report(run_dir: str | Path) -> dict[str, Any]:
    """Per epoch of a run's training phase: episodes, successes, accuracy, receipts, existed, recalled, selected.

    `existed`, `recalled` and `selected` count training episodes (see the module docstring);
    `useful_pairs` is the number of distinct (task, memory) pairs that proved useful.
    """
    run_id, location = run_location(run_dir)
    with MemoryBank(location, create=False) as bank:  # like `inspect`: a bank from an older memrl is migrated
        run = runs.get_run(bank, run_id)
        episodes = [e for e in runs.episodes(bank, run_id) if e["phase"] == "train"]
        useful = _useful_memories(bank, run_id)
        created = bank.store.created_at(sorted({m for ids in useful.values() for m in ids}))
        receipts = training_receipts(bank, run_id)
    epochs: dict[int, dict[str, Any]] = {}
    for episode in episodes:
        row = epochs.setdefault(episode["epoch"], {f: 0 for f in EPOCH_FIELDS} | {"epoch": episode["epoch"]})
        row["episodes"] += 1
        row["successes"] += int(episode["success"])
        receipt = receipts.get(episode["retrieval_id"])
        if receipt is None:
            continue
        row["receipts"] += 1
        mine = useful.get(episode["task_id"], set())
        row["existed"] += any(created[m] <= receipt["created_at"] for m in mine)
        row["recalled"] += bool(mine & receipt["candidates"])
        row["selected"] += bool(mine & receipt["selected"])
    for row in epochs.values():
        row["accuracy"] = row["successes"] / row["episodes"]
    return {"run_id": run_id, "benchmark": run["benchmark"], "method": run["method"], "bank": location,
            "useful_pairs": sum(len(ids) for ids in useful.values()),
            "epochs": [epochs[e] for e in sorted(epochs)]}


def _useful_memories(bank: MemoryBank, run_id: str) -> dict[str, set[int]]:
    """task id → the memories whose selection for one of its training episodes was rewarded positively."""
    useful: dict[str, set[int]] = {}
    for task_id, memory_id in bank.store.rewarded_selections(run_id):
        useful.setdefault(task_id, set()).add(memory_id)
    return useful


def training_receipts(bank: MemoryBank, run_id: str) -> dict[int, dict[str, Any]]:
    """retrieval id → its time, Phase-A candidates and Phase-B selection, for the run's training episodes."""
    receipts: dict[int, dict[str, Any]] = {}
    for retrieval_id, created_at, memory_id, selected_rank in bank.store.training_receipts(run_id):
        receipt = receipts.setdefault(retrieval_id, {"created_at": created_at, "candidates": set(), "selected": set()})
        if memory_id is not None:
            receipt["candidates"].add(memory_id)
            if selected_rank is not None:
                receipt["selected"].add(memory_id)
    return receipts
