"""Concurrent load on one bank: N processes, each doing M ingests and M rewards, then an exact audit.

Every worker opens its own `MemoryBank` on the same file and, M times: ingests a new memory
(with a given vector: embedder `external:load:DIM`, so the figures measure the bank, not the
embedding model), then rewards either a few "hot" memories that every worker hammers (even
steps) or the memories a fresh retrieval selected, by its receipt (odd steps). Afterwards the
audit requires the bank to hold exactly what the workers were told was committed: memory
count, visits per memory, ledger rows, receipts, Q = ledger replay, and no failed command
(in particular no "database is locked").

    python -m benchmarks.perf.load [--processes 8] [--operations 500] [--db PATH] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from memrl_cli.ops import inspection
from memrl_cli.bank import MemoryBank
from memrl_cli.method.retrieval import RetrieveParams

HOT_MEMORIES = 8
DIM = 32


def embedder_spec(dim: int) -> str:
    """The bank's embedder: vectors are given by the caller."""
    return f"external:load:{dim}"


def unit_vector(rng: np.random.Generator, dim: int) -> list[float]:
    """A random unit vector."""
    v = rng.normal(size=dim)
    return (v / np.linalg.norm(v)).tolist()


@dataclass
class WorkerResult:
    """What one worker committed (as acknowledged by the bank) and what failed."""

    worker: int
    ingested: list[int] = field(default_factory=list)
    visits: Counter = field(default_factory=Counter)
    ledger_rows: int = 0
    retrievals: int = 0
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    started: float = 0.0
    finished: float = 0.0


def work(db: str, worker: int, operations: int, dim: int, hot: list[int], barrier: Any, out: Any) -> None:
    """One worker process: M × (ingest, reward); the result goes to `out` (a queue)."""
    result = WorkerResult(worker)
    rng = np.random.default_rng(1000 + worker)
    try:
        bank = MemoryBank(db, embedder_spec(dim))
    except Exception as exc:  # noqa: BLE001 - reported, never hidden
        result.errors.append(f"open: {type(exc).__name__}: {exc}")
        out.put(result)
        return
    barrier.wait()
    result.started = time.perf_counter()
    for step in range(operations):
        try:
            t0 = time.perf_counter()
            created = bank.ingest(f"worker {worker} task {step}", f"what worker {worker} did at step {step}",
                                  "success" if step % 2 else "failure", vector=unit_vector(rng, dim))
            t1 = time.perf_counter()
            result.latencies.append(t1 - t0)
            if not created.created:
                result.errors.append(f"ingest {step}: reported as a duplicate")
            result.ingested.append(created.id)
            reward = 1.0 if rng.random() < 0.5 else -1.0
            if step % 2 == 0:
                targets = sorted({int(x) for x in rng.choice(hot, size=2, replace=False)} | {created.id})
                updates = bank.reward(reward, memory_ids=targets, source=f"load:{worker}")
            else:
                receipt = bank.retrieve(f"worker {worker} query {step}", RetrieveParams(k1=5, k2=3, threshold=-1),
                                        vector=unit_vector(rng, dim))
                result.retrievals += 1
                updates = bank.reward(reward, retrieval_id=receipt.id, source=f"load:{worker}") \
                    if receipt.memories else []
            result.latencies.append(time.perf_counter() - t1)
            for u in updates:
                result.visits[u["id"]] += 1
            result.ledger_rows += len(updates)
        except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
            result.errors.append(f"step {step}: {type(exc).__name__}: {exc}")
    result.finished = time.perf_counter()
    bank.close()
    out.put(result)


@dataclass
class LoadReport:
    """The outcome of a load run."""

    processes: int
    operations: int
    memories: int
    ledger_rows: int
    retrievals: int
    writes: int
    seconds: float
    writes_per_second: float
    latency_ms: dict[str, float]
    errors: list[str]
    locked_errors: int
    problems: list[str]

    @property
    def ok(self) -> bool:
        """No failed operation and an exact audit."""
        return not self.errors and not self.problems


def seed_bank(db: str, dim: int) -> list[int]:
    """Create the bank with the hot memories every worker rewards."""
    rng = np.random.default_rng(0)
    with MemoryBank(db, embedder_spec(dim)) as bank:
        results = bank.ingest_many([{"intent": f"hot memory {i}", "experience": f"shared experience {i}",
                                     "vector": unit_vector(rng, dim)} for i in range(HOT_MEMORIES)])
    return [r.id for r in results]


def audit(db: str, hot: list[int], results: list[WorkerResult]) -> list[str]:
    """Compare the bank with what the workers committed; return the differences."""
    problems: list[str] = []
    visits: Counter = Counter()
    for r in results:
        visits.update(r.visits)
    expected_ids = set(hot) | {i for r in results for i in r.ingested}
    with MemoryBank(db, create=False) as bank:
        report = inspection.verify(bank)
        problems += report["problems"]
        stored = dict(bank.conn.execute("SELECT id, visits FROM memories").fetchall())
        if set(stored) != expected_ids:
            problems.append(f"memories: {len(stored)} stored, {len(expected_ids)} acknowledged "
                            f"({len(set(stored) ^ expected_ids)} differ)")
        wrong = [i for i, v in stored.items() if v != visits.get(i, 0)]
        if wrong:
            problems.append(f"{len(wrong)} memories have visits that differ from the acknowledged rewards")
        rows = bank.conn.execute("SELECT count(*) FROM rewards").fetchone()[0]
        if rows != sum(r.ledger_rows for r in results):
            problems.append(f"ledger: {rows} rows, {sum(r.ledger_rows for r in results)} acknowledged")
        receipts = bank.conn.execute("SELECT count(*) FROM retrievals").fetchone()[0]
        if receipts != sum(r.retrievals for r in results):
            problems.append(f"receipts: {receipts} stored, {sum(r.retrievals for r in results)} acknowledged")
    return problems


def run_load(db: str, processes: int = 8, operations: int = 500, dim: int = DIM) -> LoadReport:
    """Seed a new bank at `db`, run the workers, audit the result."""
    if os.path.exists(db):
        raise SystemExit(f"{db} exists; the load test needs a new bank")
    hot = seed_bank(db, dim)
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(processes), ctx.Queue()
    workers = [ctx.Process(target=work, args=(db, w, operations, dim, hot, barrier, out)) for w in range(processes)]
    for p in workers:
        p.start()
    results = [out.get(timeout=3600) for _ in workers]
    for p in workers:
        p.join()
    errors = [e for r in results for e in r.errors]
    started = [r.started for r in results if r.started]
    seconds = max(r.finished for r in results) - min(started) if started else 0.0
    latencies = np.array([x for r in results for x in r.latencies]) * 1000
    receipts = sum(r.retrievals for r in results)
    writes = processes * operations * 2 + receipts
    return LoadReport(
        processes=processes, operations=operations, memories=len(hot) + sum(len(r.ingested) for r in results),
        ledger_rows=sum(r.ledger_rows for r in results), retrievals=receipts, writes=writes,
        seconds=round(seconds, 3), writes_per_second=round(writes / seconds, 1) if seconds else 0.0,
        latency_ms={"p50": round(float(np.percentile(latencies, 50)), 2) if len(latencies) else 0.0,
                    "p99": round(float(np.percentile(latencies, 99)), 2) if len(latencies) else 0.0,
                    "max": round(float(latencies.max()), 2) if len(latencies) else 0.0},
        errors=errors, locked_errors=sum("locked" in e for e in errors), problems=audit(db, hot, results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--operations", type=int, default=500, help="ingests (and as many rewards) per process")
    parser.add_argument("--dim", type=int, default=DIM)
    parser.add_argument("--db", default=None, help="a new bank file (default: a temporary one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = run_load(args.db or os.path.join(tmp, "load.db"), args.processes, args.operations, args.dim)
    if args.json:
        print(json.dumps({**asdict(report), "ok": report.ok}))
    else:
        print(f"{report.processes} processes × {report.operations} (ingest + reward): {report.writes} write "
              f"transactions ({report.retrievals} of them receipts) in {report.seconds:.1f} s = "
              f"{report.writes_per_second:.0f} writes/s; latency p50 {report.latency_ms['p50']} ms, "
              f"p99 {report.latency_ms['p99']} ms, max {report.latency_ms['max']} ms")
        print(f"bank: {report.memories} memories, {report.ledger_rows} ledger rows; failed operations: "
              f"{len(report.errors)} ({report.locked_errors} 'database is locked')")
        for line in report.errors[:10] + report.problems:
            print(f"  {line}")
        print("audit: exact" if report.ok else "audit: FAILED")
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":
    main()
