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

`utility_report` is the paper's utility analysis: does a memory's learned Q predict success?
For every memory selected for a training episode, its Q when it was retrieved (from the receipt)
is paired with the episode's outcome; per epoch and over the run, the empirical success rate by
Q bin and Spearman's rank correlation between Q and success.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from memrl_cli.ops import runs
from memrl_cli.bank.memory_bank import MemoryBank

EPOCH_FIELDS = ("epoch", "episodes", "successes", "accuracy", "receipts", "existed", "recalled", "selected")


def run_location(run_dir: str | Path) -> tuple[str, str]:
    """(run id, bank location) of a run directory (`runs.run_directory`)."""
    stored, bank = runs.run_directory(run_dir)
    return str(stored["run_id"]), bank


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


Q_BINS = (-1.0, -0.5, -0.1, 0.1, 0.5, 1.0)  # edges: strongly negative, negative, about 0, positive, strongly positive


def _ranks(values: list[float]) -> list[float]:
    """Ranks from 1, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (None when either side is constant or there are fewer than 3 pairs)."""
    if len(xs) < 3:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return None if sxx == 0 or syy == 0 else sxy / math.sqrt(sxx * syy)


def _bins(pairs: list[tuple[float, bool]]) -> list[dict[str, Any]]:
    """Success rate of the episodes whose selected memory had Q in each bin of Q_BINS (Q outside: the end bins)."""
    edges = Q_BINS
    rows: list[dict[str, Any]] = [{"low": lo, "high": hi, "selections": 0, "successes": 0}
                                  for lo, hi in zip(edges, edges[1:])]
    for q, ok in pairs:
        i = next((k for k, hi in enumerate(edges[1:-1]) if q < hi), len(rows) - 1)
        rows[i]["selections"] += 1
        rows[i]["successes"] += int(ok)
    for row in rows:
        row["success_rate"] = row["successes"] / row["selections"] if row["selections"] else None
    return rows


def utility_report(run_dir: str | Path) -> dict[str, Any]:
    """The paper's utility analysis of a run (see the module docstring): per epoch and overall, the success rate
    by Q bin of the selected memories and Spearman's correlation of their Q with the episode's success."""
    run_id, location = run_location(run_dir)
    with MemoryBank(location, create=False) as bank:
        run = runs.get_run(bank, run_id)
        rows = bank.store.selected_q(run_id)
    by_epoch: dict[int, list[tuple[float, bool]]] = {}
    for epoch, ok, q in rows:
        by_epoch.setdefault(epoch, []).append((q, ok))

    def analyse(pairs: list[tuple[float, bool]]) -> dict[str, Any]:
        return {"selections": len(pairs), "spearman": spearman([q for q, _ in pairs], [float(ok) for _, ok in pairs]),
                "bins": _bins(pairs)}

    return {"run_id": run_id, "benchmark": run["benchmark"], "method": run["method"],
            "epochs": [{"epoch": e, **analyse(p)} for e, p in sorted(by_epoch.items())],
            "overall": analyse([pair for p in by_epoch.values() for pair in p])}
