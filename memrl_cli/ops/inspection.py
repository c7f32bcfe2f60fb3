"""Read-only views of a bank: top memories by Q, one memory's history, statistics,
why a retrieval chose what it chose, and a full consistency check (`verify`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from memrl_cli.bank.memory_bank import MemoryBank
from memrl_cli.errors import MemrlError
from memrl_cli.method.learning import replay
from memrl_cli.store.views import MEMORY_FIELDS as MEMORY_FIELDS  # the fields of a memory `inspect` shows

def _memory(row: dict[str, Any]) -> dict[str, Any]:
    row["metadata"] = json.loads(row["metadata"])
    return row


def top_q(bank: MemoryBank, n: int = 10, scopes: Sequence[str | None] = ()) -> list[dict[str, Any]]:
    """The `n` memories with the highest Q (ties: most visited, then oldest), quarantined ones
    included (`quarantined_at` set); with `scopes`, only those whose scope matches one (None: no scope)."""
    if n < 1:
        raise MemrlError(f"--top-q takes a positive number, got {n}")
    return [_memory(r) for r in bank.store.top_memories(n, scopes)]


def with_ledger(bank: MemoryBank, memory_id: int) -> dict[str, Any]:
    """One memory's stored record with its ledger (rewards and Q assignments) and its quarantine log
    (`inspect --memory` and each version of `memrl history`)."""
    row = bank.store.memory_record(memory_id)
    if row is None:
        raise MemrlError(f"unknown memory id {memory_id}")
    found = _memory(row)
    found["ledger"] = bank.store.memory_ledger(memory_id)
    found["quarantine_log"] = bank.store.memory_quarantine_log(memory_id)
    return found


def memory(bank: MemoryBank, memory_id: int) -> dict[str, Any]:
    """One memory with its ledger history, its quarantine log, and the receipts it appeared in."""
    found = with_ledger(bank, memory_id)
    found["retrievals"] = bank.store.memory_receipts(memory_id)
    return found


def stats(bank: MemoryBank) -> dict[str, Any]:
    """Count (forgotten memories included, and counted apart), Q distribution, share never retrieved,
    outcomes, embedder, calibration, index state."""
    count = bank.count()
    qs = bank.store.q_values()
    never = bank.store.never_selected()
    outcomes = bank.store.outcome_counts()
    q_summary: dict[str, Any] = {}
    if count:
        hist, edges = np.histogram(qs, bins=10, range=(min(-1.0, qs.min()), max(1.0, qs.max())))
        q_summary = {"mean": float(qs.mean()), "median": float(np.median(qs)), "min": float(qs.min()),
                     "max": float(qs.max()), "positive": int((qs > 0).sum()), "zero": int((qs == 0).sum()),
                     "negative": int((qs < 0).sum()),
                     "histogram": {"edges": [float(e) for e in edges], "counts": [int(c) for c in hist]}}
    embedder = bank.meta("embedder")
    mean, std = bank.similarity_stats()
    return {
        "path": bank.path,
        "count": count,
        "q": q_summary,
        "never_retrieved": int(never),
        "never_retrieved_share": (never / count) if count else 0.0,
        "quarantined": len(bank.quarantined()),
        "forgotten": bank.store.forgotten_count(),
        "outcomes": {k: int(outcomes.get(k, 0)) for k in ("success", "failure", "unknown")},
        "retrievals": bank.store.receipt_count(),
        "rewards": bank.store.ledger_size(),
        "reward_range": list(bank.reward_range()),
        "embedder": {k: embedder[k] for k in ("spec", "dim", "normalized")} if embedder else None,
        "calibration": {"mean": mean, "std": std, "stats": bank.meta("sim_stats"),
                        "override": bank.meta("sim_stats_override")},
        "engine": bank.store.kind,
        "index": bank.store.index_info(),
        "schema_version": bank.store.schema_version(),
    }


def explain(bank: MemoryBank, retrieval_id: int) -> dict[str, Any]:
    """A receipt: the query, parameters, and every Phase-A candidate with why it was (not) selected."""
    receipt = bank.store.receipt(retrieval_id)
    if receipt is None:
        raise MemrlError(f"unknown retrieval id {retrieval_id}")
    receipt["params"] = json.loads(receipt["params"])
    receipt["explored"] = bool(receipt["explored"])
    candidates = bank.store.receipt_candidates(retrieval_id)
    k2 = receipt["params"]["k2"]
    for rank, c in enumerate(candidates):  # ranks count from 0, as recall_rank and selected_rank in the receipt
        c["score_rank"] = rank
        if c["selected_rank"] is not None:
            c["why"] = "selected by ε-exploration" if receipt["explored"] else f"selected: score rank {rank} < k2={k2}"
        else:
            c["why"] = "not selected: exploration drew others" if receipt["explored"] else \
                f"not selected: score rank {rank} ≥ k2={k2}"
    receipt["candidates"] = candidates
    receipt["rewards"] = bank.store.receipt_rewards(retrieval_id)
    return receipt


def verify(bank: MemoryBank) -> dict[str, Any]:
    """Check the whole bank: engine integrity, a vector per memory, index coverage, Q = ledger replay;
    all of it on one state of the bank, while others may write."""
    with bank.snapshot():
        return _verify(bank)


def _verify(bank: MemoryBank) -> dict[str, Any]:
    problems: list[str] = []
    integrity = bank.store.integrity()
    if integrity != ["ok"]:
        problems += [f"integrity: {line}" for line in integrity[:10]]
    dim = bank.dim
    if dim is not None:
        bad = bank.store.bad_vectors(dim)
        if bad:
            problems.append(f"{bad} memories have no vector of dimension {dim}")
    problems += bank.store.index_problems(bank.count())
    ledgers = bank.store.ledgers()
    mismatched = 0
    for mid, q, q_init in bank.store.q_and_initial_q():
        rows = ledgers.get(mid, [])
        chain = [q_init] + [r["q_after"] for r in rows]
        try:
            consistent = abs(replay(q_init, rows) - q) <= 1e-9 and all(
                abs(r["q_before"] - before) <= 1e-9 for r, before in zip(rows, chain))
        except (TypeError, ValueError, MemrlError):  # rows a foreign or altered file carries
            consistent = False
        mismatched += not consistent
    if mismatched:
        problems.append(f"{mismatched} memories have a Q that differs from the replay of their ledger")
    unlogged = bank.store.unlogged_quarantines()
    if unlogged:
        problems.append(f"{unlogged} memories have a quarantine state that differs from their quarantine log")
    return {"ok": not problems, "problems": problems, "memories": bank.count(),
            "ledger_rows": sum(len(v) for v in ledgers.values()), "integrity": integrity[0] if integrity else "?"}
