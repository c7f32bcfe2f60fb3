"""Read-only views of a bank: top memories by Q, one memory's history, statistics,
why a retrieval chose what it chose, and a full consistency check (`verify`)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from memrl_cli.bank import MemoryBank
from memrl_cli.errors import MemrlError
from memrl_cli.learn import replay

MEMORY_FIELDS = ("id", "intent", "experience", "outcome", "task_id", "source", "q", "q_init", "visits",
                 "created_at", "updated_at", "last_used_at", "metadata", "quarantined_at")


def _rows(bank: MemoryBank, sql: str, args: tuple = ()) -> list[dict[str, Any]]:
    cursor = bank.conn.execute(sql, args)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


def _memory(row: dict[str, Any]) -> dict[str, Any]:
    row["metadata"] = json.loads(row["metadata"])
    return row


def top_q(bank: MemoryBank, n: int = 10) -> list[dict[str, Any]]:
    """The `n` memories with the highest Q (ties: most visited, then oldest), quarantined ones
    included (`quarantined_at` set)."""
    if n < 1:
        raise MemrlError(f"--top-q takes a positive number, got {n}")
    return [_memory(r) for r in _rows(bank, f"SELECT {', '.join(MEMORY_FIELDS)} FROM memories "
                                            "ORDER BY q DESC, visits DESC, id LIMIT ?", (n,))]


def memory(bank: MemoryBank, memory_id: int) -> dict[str, Any]:
    """One memory with its ledger history, its quarantine log, and the receipts it appeared in."""
    rows = _rows(bank, f"SELECT {', '.join(MEMORY_FIELDS)} FROM memories WHERE id = ?", (memory_id,))
    if not rows:
        raise MemrlError(f"unknown memory id {memory_id}")
    found = _memory(rows[0])
    found["ledger"] = _rows(bank, "SELECT id, retrieval_id, kind, reward, alpha, q_floor, q_before, q_after, "
                                  "created_at, source FROM rewards WHERE memory_id = ? ORDER BY id", (memory_id,))
    found["quarantine_log"] = _rows(bank, "SELECT action, reason, actor, created_at FROM quarantine_log "
                                          "WHERE memory_id = ? ORDER BY id", (memory_id,))
    found["retrievals"] = _rows(bank, "SELECT c.retrieval_id, r.query, r.created_at, c.recall_rank, c.similarity, "
                                      "c.q, c.score, c.selected_rank FROM retrieval_candidates c JOIN retrievals r "
                                      "ON r.id = c.retrieval_id WHERE c.memory_id = ? ORDER BY c.retrieval_id",
                                (memory_id,))
    return found


def stats(bank: MemoryBank) -> dict[str, Any]:
    """Count, Q distribution, share never retrieved, outcomes, embedder, calibration, index state."""
    count = bank.count()
    qs = np.array([r[0] for r in bank.conn.execute("SELECT q FROM memories")], dtype=np.float64)
    never = bank.conn.execute("SELECT count(*) FROM memories m WHERE NOT EXISTS (SELECT 1 FROM "
                              "retrieval_candidates c WHERE c.memory_id = m.id AND c.selected_rank IS NOT NULL)"
                              ).fetchone()[0]
    outcomes = dict(bank.conn.execute("SELECT outcome, count(*) FROM memories GROUP BY outcome").fetchall())
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
        "outcomes": {k: int(outcomes.get(k, 0)) for k in ("success", "failure", "unknown")},
        "retrievals": int(bank.conn.execute("SELECT count(*) FROM retrievals").fetchone()[0]),
        "rewards": int(bank.conn.execute("SELECT count(*) FROM rewards").fetchone()[0]),
        "embedder": {k: embedder[k] for k in ("spec", "dim", "normalized")} if embedder else None,
        "calibration": {"mean": mean, "std": std, "stats": bank.meta("sim_stats"),
                        "override": bank.meta("sim_stats_override")},
        "engine": bank.store.kind,
        "index": bank.store.index_info(),
        "schema_version": bank.store.schema_version(),
    }


def explain(bank: MemoryBank, retrieval_id: int) -> dict[str, Any]:
    """A receipt: the query, parameters, and every Phase-A candidate with why it was (not) selected."""
    rows = _rows(bank, "SELECT id, query, params, sim_mean, sim_std, explored, created_at FROM retrievals "
                       "WHERE id = ?", (retrieval_id,))
    if not rows:
        raise MemrlError(f"unknown retrieval id {retrieval_id}")
    receipt = rows[0]
    receipt["params"] = json.loads(receipt["params"])
    receipt["explored"] = bool(receipt["explored"])
    candidates = _rows(bank, "SELECT c.memory_id, m.intent, m.outcome, c.recall_rank, c.similarity, c.q, c.z_sim, "
                             "c.z_q, c.score, c.selected_rank FROM retrieval_candidates c JOIN memories m ON "
                             "m.id = c.memory_id WHERE c.retrieval_id = ? ORDER BY c.score DESC, c.recall_rank",
                       (retrieval_id,))
    k2 = receipt["params"]["k2"]
    for rank, c in enumerate(candidates):  # ranks count from 0, as recall_rank and selected_rank in the receipt
        c["score_rank"] = rank
        if c["selected_rank"] is not None:
            c["why"] = "selected by ε-exploration" if receipt["explored"] else f"selected: score rank {rank} < k2={k2}"
        else:
            c["why"] = "not selected: exploration drew others" if receipt["explored"] else \
                f"not selected: score rank {rank} ≥ k2={k2}"
    receipt["candidates"] = candidates
    receipt["rewards"] = _rows(bank, "SELECT memory_id, reward, alpha, q_before, q_after, created_at FROM rewards "
                                     "WHERE retrieval_id = ? ORDER BY id", (retrieval_id,))
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
    index = bank.store.index_info()
    if index["kind"] == "vec" and index.get("indexed") is not None:
        indexed = index["indexed"]
        if indexed != bank.count():
            problems.append(f"the sqlite-vec index has {indexed} vectors for {bank.count()} memories "
                            "(run `memrl doctor --rebuild-index`)")
    ledgers: dict[int, list[dict[str, Any]]] = {}
    for row in _rows(bank, "SELECT memory_id, kind, reward, alpha, q_floor, q_before, q_after FROM rewards ORDER BY id"):
        ledgers.setdefault(row["memory_id"], []).append(row)
    mismatched = 0
    for mid, q, q_init in bank.conn.execute("SELECT id, q, q_init FROM memories"):
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
    unlogged = bank.conn.execute(
        "SELECT count(*) FROM memories m WHERE (m.quarantined_at IS NOT NULL) != (coalesce((SELECT l.action FROM "
        "quarantine_log l WHERE l.memory_id = m.id ORDER BY l.id DESC LIMIT 1), '') = 'quarantine')").fetchone()[0]
    if unlogged:
        problems.append(f"{unlogged} memories have a quarantine state that differs from their quarantine log")
    return {"ok": not problems, "problems": problems, "memories": bank.count(),
            "ledger_rows": sum(len(v) for v in ledgers.values()), "integrity": integrity[0] if integrity else "?"}
