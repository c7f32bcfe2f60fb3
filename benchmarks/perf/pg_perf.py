"""The PostgreSQL bank against the SQLite bank, in one run: concurrent rewards and KNN latency.

Both banks hold the same N memories (default 100,000): the clustered 384-d vectors and typical
texts of `bank_perf`, ingested through `ingest_many` in chunks of 5,000 (the ingest rates are
reported too). Then:

- **Rewards**: P processes (default 8) each apply R (default 500) ledgered rewards through
  `MemoryBank.reward(...)`, one transaction each, all started together; in two modes, every
  reward on one hot memory, and every reward on a random memory. Reported: updates per second
  (all rewards over the span from the first worker's start to the last one's end), lost
  updates (expected − Σ visits gained: must be 0), and `inspection.verify` (Q equals the replay
  of its ledger for every memory). The same workload runs on the SQLite bank, and on PostgreSQL
  as the engine's floor: as many jobs of the same kind (the same memory ids; the hot one, or
  random ones drawn afresh) as bare statements of the same shape (lock a row, move its Q, append a
  ledger row: one `UPDATE … RETURNING` feeding an `INSERT`, autocommit) on a copy of the memories'
  ids and Q, through psycopg alone.
- **KNN latency**: p50/p99 of `bank.retrieve(..., vector=q, record=False)` for PostgreSQL exact
  search, PostgreSQL HNSW (built first: its build time is reported; recall@k1 against exact), the
  SQLite bank's in-process numpy index and its opt-in sqlite-vec index (built for this), timed
  interleaved query by query, in an order rotated per query (the first search of a query reads its
  cold pages), so that load from other jobs and cold caches hit all alike; plus the engines' bare
  KNN (`store.knn`, without the rest of a retrieve) on PostgreSQL, for k1 rows and (HNSW) for the
  pool × SEARCH_WIDTH rows a grouped retrieve searches.
- **HNSW serving**: the HNSW retrieve as a database serving retrieves sees it: a new connection at the
  bank's own settings answers SERVING_BLOCKS sets of fresh queries (never searched before) one after
  the other, with no other work between (their exact answers are computed first). It runs after the
  measurement above, whose HNSW searches have likely read much of the graph into the server's buffers.
- **HNSW ef_search**: retrieve latency and recall@k1 at each `hnsw.ef_search` of `EF_SEARCH`, for the
  grouped retrieve (`recall="groups"`, what these figures were first measured on) and for one that recalls k1
  memories (`recall="memories"`, the default since issue 31) (the bank's
  default, `memrl_cli.store.postgres.HNSW_EF_SEARCH`, is chosen from this). Each setting is timed on fresh
  queries of its own; recall is measured on the interleaved measurement's queries, the same for
  every setting. Fresh queries come from a random stream of their own (seed, 1).
- **Rewards with the HNSW index**: the random-memory rewards again, on the PostgreSQL bank once its
  HNSW index exists (what a reward costs the graph), with the index's growth.

The server is a throwaway `benchmarks.testing.pg_server.LocalPostgres`, or the server at `--pg-url` /
`MEMRL_PERF_PG_URL`: an admin `postgresql://` URL whose role may create databases (the run
creates `memrl_perf_*` databases there and drops them at the end).

    python -m benchmarks.perf.pg_perf [--memories 100000] [--queries 100] [--rewards-only] [--pg-url URL]
        [--out pg.json]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.perf.bank_perf import build_bank, clustered_vectors, near_queries, percentiles
from memrl_cli.bank import MemoryBank
from memrl_cli.ops.inspection import verify
from memrl_cli.store.postgres import PostgresStore
from memrl_cli.method.retrieval import SEARCH_WIDTH, RetrieveParams

MODES = ("hot", "random")
ENGINES = ("postgresql", "sqlite")
RETRIEVERS = ("pg_exact", "pg_hnsw", "sqlite_numpy", "sqlite_vec")
BARE_KNN = ("pg_exact_knn", "pg_hnsw_knn", "pg_hnsw_knn_grouped")
EF_SEARCH = (100, 200, 400, 800, 1000)  # hnsw.ef_search values swept for recall@k1 against latency
SERVING_BLOCKS = 3  # sets of fresh queries a new connection serves in a row (the HNSW target's measurement)


@contextlib.contextmanager
def server(url: str | None) -> Iterator[str]:
    """An admin URL: the given one, else a throwaway local server's (stopped afterwards)."""
    if url:
        yield url
        return
    from benchmarks.testing.pg_server import LocalPostgres

    with LocalPostgres() as local:
        yield local.dsn


def _reward_worker(location: str, jobs: list[tuple[int, float]], barrier: Any, out: Any) -> None:
    """One process: open the bank, wait for the others, apply `jobs` one reward transaction each."""
    try:
        bank = MemoryBank(location)
        bank.count()
    except BaseException:
        barrier.abort()  # the parent and the other workers stop waiting
        raise
    with bank:
        _timed_jobs(lambda memory_id, reward: bank.reward(reward, memory_ids=[memory_id], source="perf"),
                    jobs, barrier, out)


# The floor of a reward on PostgreSQL: lock a row, move its Q, append a ledger row, in one autocommit statement.
FLOOR_TABLES = ("memrl_perf_floor", "memrl_perf_floor_ledger")
FLOOR_SQL = ("WITH moved AS (UPDATE memrl_perf_floor SET q = q + 0.3 * (%s - q) WHERE id = %s RETURNING id, q) "
             "INSERT INTO memrl_perf_floor_ledger (memory_id, q_after) SELECT id, q FROM moved")


def _floor_worker(url: str, jobs: list[tuple[int, float]], barrier: Any, out: Any) -> None:
    """One process: a bare psycopg connection applying `jobs` as FLOOR_SQL statements."""
    import psycopg

    try:
        conn = psycopg.connect(url, autocommit=True)
    except BaseException:
        barrier.abort()
        raise
    with conn:
        _timed_jobs(lambda memory_id, reward: conn.execute(FLOOR_SQL, (reward, memory_id)), jobs, barrier, out)


def _timed_jobs(apply: Callable[[int, float], Any], jobs: list[tuple[int, float]], barrier: Any, out: Any) -> None:
    """Wait for the other workers, apply every job, put (start, end, errors) on `out`."""
    errors: list[str] = []
    barrier.wait()
    start = time.monotonic()
    for memory_id, reward in jobs:
        try:
            apply(memory_id, reward)
        except Exception as exc:  # reported, not fatal: a failed reward is an error, not a lost update
            errors.append(f"{type(exc).__name__}: {exc}")
    out.put((start, time.monotonic(), errors))


def visits_and_ledger(location: str) -> tuple[int, int]:
    """(Σ visits over all memories, ledger rows)."""
    with MemoryBank(location) as bank:
        visits = int(bank.conn.execute("SELECT coalesce(sum(visits), 0) FROM memories").fetchone()[0])
        return visits, int(bank.conn.execute("SELECT count(*) FROM rewards").fetchone()[0])


def reward_jobs(ids: list[int], mode: str, count: int, rng: np.random.Generator) -> list[tuple[int, float]]:
    """`count` (memory id, reward ±1) jobs: all on the first id (`hot`) or on random ones."""
    targets = np.full(count, ids[0]) if mode == "hot" else rng.choice(ids, size=count)
    return [(int(m), float(r)) for m, r in zip(targets, rng.choice([-1.0, 1.0], size=count))]


def run_workers(worker: Callable[..., None], location: str, jobs: list[tuple[int, float]],
                processes: int) -> tuple[float, list[str]]:
    """Split `jobs` over `processes` spawned workers started together; (seconds from the first start to
    the last end, errors)."""
    per_process = len(jobs) // processes
    context = multiprocessing.get_context("spawn")  # the parent may hold threads (BLAS, ONNX): no fork
    barrier, out = context.Barrier(processes + 1), context.Queue()
    workers = [context.Process(target=worker,
                               args=(location, jobs[p * per_process:(p + 1) * per_process], barrier, out))
               for p in range(processes)]
    for process in workers:
        process.start()
    barrier.wait(timeout=300)
    spans = [out.get(timeout=600) for _ in workers]
    for process in workers:
        process.join()
    return max(s[1] for s in spans) - min(s[0] for s in spans), [e for s in spans for e in s[2]]


def concurrent_rewards(location: str, ids: list[int], mode: str, processes: int, per_process: int,
                       rng: np.random.Generator) -> dict[str, Any]:
    """`processes` × `per_process` rewards on one hot memory or on random ones; throughput, losses, replay."""
    expected = processes * per_process
    jobs = reward_jobs(ids, mode, expected, rng)
    visits_before, ledger_before = visits_and_ledger(location)
    seconds, errors = run_workers(_reward_worker, location, jobs, processes)
    visits_after, ledger_after = visits_and_ledger(location)
    with MemoryBank(location) as bank:
        check = verify(bank)
    return {"mode": mode, "processes": processes, "per_process": per_process, "expected": expected,
            "seconds": seconds, "updates_per_s": (expected - len(errors)) / seconds,
            "errors": len(errors), "error_samples": errors[:3],
            "lost": expected - len(errors) - (visits_after - visits_before),
            "ledger_rows_added": ledger_after - ledger_before, "verify_ok": check["ok"],
            "verify_problems": check["problems"]}


def reward_floor(pg: str, ids: list[int], mode: str, processes: int, per_process: int,
                 rng: np.random.Generator) -> dict[str, Any]:
    """The same workload as `concurrent_rewards` as bare FLOOR_SQL statements, on a copy of the bank's ids
    and Q (dropped afterwards): what the engine does without memrl."""
    import psycopg

    expected = processes * per_process
    with psycopg.connect(pg, autocommit=True) as conn:
        conn.execute("CREATE TABLE memrl_perf_floor AS SELECT id, q FROM memories")
        conn.execute("ALTER TABLE memrl_perf_floor ADD PRIMARY KEY (id)")
        conn.execute("CREATE TABLE memrl_perf_floor_ledger (id bigserial PRIMARY KEY, memory_id int8, q_after float8)")
        try:
            seconds, errors = run_workers(_floor_worker, pg, reward_jobs(ids, mode, expected, rng), processes)
            rows = conn.execute("SELECT count(*) FROM memrl_perf_floor_ledger").fetchone()[0]
        finally:
            conn.execute(f"DROP TABLE {', '.join(FLOOR_TABLES)}")
    return {"mode": mode, "processes": processes, "per_process": per_process, "expected": expected,
            "seconds": seconds, "updates_per_s": (expected - len(errors)) / seconds, "errors": len(errors),
            "error_samples": errors[:3], "ledger_rows_added": int(rows)}


def knn_latency(pg: str, sqlite: Path, queries: np.ndarray, params: RetrieveParams) -> dict[str, Any]:
    """Retrieve latency of each retriever, interleaved per query; recall@k1 against PostgreSQL exact."""
    banks = {"pg_exact": MemoryBank(pg, index="exact"), "pg_hnsw": MemoryBank(pg, index="hnsw"),
             "sqlite_numpy": MemoryBank(sqlite, index="numpy"), "sqlite_vec": MemoryBank(sqlite, index="vec")}
    try:
        for bank in banks.values():  # warm-up: connections, the in-process matrix, pages
            bank.retrieve("warm-up", params, vector=queries[0].tolist(), record=False)
        samples: dict[str, list[float]] = {name: [] for name in (*RETRIEVERS, *BARE_KNN)}
        found = dict.fromkeys(RETRIEVERS, 0)
        expected = 0
        for n, q in enumerate(queries):
            as_list = q.tolist()
            got: dict[str, set[int]] = {}

            def retrieve(name: str) -> None:
                hit = banks[name].retrieve("perf query", params, vector=as_list, record=False)
                got[name] = {c.memory_id for c in hit.candidates}

            timed: list[tuple[str, Callable[[], Any]]] = [(name, functools.partial(retrieve, name)) for name in banks]
            # the engine's KNN alone, without the rest of a retrieve: for k1 rows, and the pool × SEARCH_WIDTH
            # rows (ids only) a grouped retrieve searches
            timed += [(f"pg_{mode}_knn", functools.partial(banks[f"pg_{mode}"].store.knn, q, params.k1, mode))
                      for mode in ("exact", "hnsw")]
            timed.append(("pg_hnsw_knn_grouped",
                          functools.partial(banks["pg_hnsw"].store.knn, q, params.pool * SEARCH_WIDTH, "hnsw")))
            for name, call in timed[n % len(timed):] + timed[:n % len(timed)]:  # no one always first (cold pages)
                start = time.perf_counter()
                call()
                samples[name].append(time.perf_counter() - start)
            expected += len(got["pg_exact"])
            for name in RETRIEVERS:
                found[name] += len(got[name] & got["pg_exact"])
        out: dict[str, Any] = {"queries": len(queries)}
        for name in RETRIEVERS:
            out[name] = {**percentiles(samples[name]), "recall_at_k1": found[name] / max(expected, 1)}
        for name in BARE_KNN:
            out[name] = percentiles(samples[name])
        return out
    finally:
        for bank in banks.values():
            bank.close()


def retrieve_each(bank: MemoryBank, queries: np.ndarray, params: RetrieveParams) -> tuple[list[float], list[set[int]]]:
    """Seconds of each retrieve of `queries`, one after the other, and the memories each recalled."""
    samples, recalled = [], []
    for q in queries:
        start = time.perf_counter()
        hit = bank.retrieve("perf query", params, vector=q.tolist(), record=False)
        samples.append(time.perf_counter() - start)
        recalled.append({c.memory_id for c in hit.candidates})
    return samples, recalled


def exact_answers(pg: str, queries: np.ndarray, params: RetrieveParams) -> list[set[int]]:
    """The memories an exact retrieve recalls for each query (recall@k1's reference)."""
    with MemoryBank(pg, index="exact") as bank:
        return retrieve_each(bank, queries, params)[1]


def recall_at_k1(recalled: list[set[int]], exact: list[set[int]]) -> float:
    """The share of the exact retrieves' memories that were recalled, over all queries."""
    return sum(len(got & want) for got, want in zip(recalled, exact)) / max(sum(map(len, exact)), 1)


def hnsw_serving(pg: str, draw_queries: Callable[[], np.ndarray], params: RetrieveParams,
                 blocks: int) -> dict[str, Any]:
    """HNSW retrieve latency as a database serving retrieves sees it: a new connection at the bank's own settings
    answers `blocks` sets of fresh `draw_queries()`, one query after the other with no other work between (their
    exact answers are computed first, in a block). p50/p99 over all and p50 of each block, recall@k1, and the bank's
    `ef_search` (a grouped retrieve searches with max(ef_search, its width): PostgresStore.knn)."""
    tested = np.concatenate([draw_queries() for _ in range(blocks)])
    exact = exact_answers(pg, tested, params)
    with MemoryBank(pg, index="hnsw") as bank:
        assert isinstance(bank.store, PostgresStore)
        samples, recalled = retrieve_each(bank, tested, params)
        ef_search = bank.store.ef_search
    size = len(samples) // blocks  # every set has as many queries
    return {"queries": len(samples), "ef_search": ef_search, **percentiles(samples),
            "recall_at_k1": recall_at_k1(recalled, exact),
            "p50_ms_by_block": [percentiles(samples[b * size:(b + 1) * size])["p50_ms"] for b in range(blocks)]}


def hnsw_sweep(pg: str, recall_queries: np.ndarray, draw_queries: Callable[[], np.ndarray], params: RetrieveParams,
               efs: tuple[int, ...]) -> list[dict[str, Any]]:
    """Retrieve latency and recall@k1 of the HNSW index at each `hnsw.ef_search`: latency on fresh `draw_queries()`
    for each setting (none of them searched before), recall@k1 (against the exact search) on `recall_queries`, the
    same for every setting."""
    exact = exact_answers(pg, recall_queries, params)
    with MemoryBank(pg, index="hnsw") as bank:
        assert isinstance(bank.store, PostgresStore)
        bank.retrieve("warm-up", params, vector=recall_queries[0].tolist(), record=False)  # the connection
        out = []
        for ef in efs:
            bank.store.tune_hnsw(int(ef))  # a grouped retrieve searches max(ef, its width) (PostgresStore.knn)
            samples, _ = retrieve_each(bank, draw_queries(), params)
            recall = recall_at_k1(retrieve_each(bank, recall_queries, params)[1], exact)
            out.append({"ef_search": ef, **percentiles(samples), "recall_at_k1": recall})
        return out


def table_sizes(pg: str) -> dict[str, int]:
    """Bytes of the PostgreSQL bank's memories table (heap, with TOAST) and its indexes, and of the HNSW
    index (whichever graph it is) and the copy of the vectors it indexes (`memory_vectors`)."""
    with MemoryBank(pg) as bank:
        row = bank.conn.execute("SELECT pg_table_size('memories'), pg_indexes_size('memories'), "
                                "(SELECT coalesce(sum(pg_relation_size(c.oid)), 0) FROM pg_class c "
                                "JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'hnsw'), "
                                "coalesce(pg_table_size(to_regclass('memory_vectors')), 0)").fetchone()
    return {"table_bytes": int(row[0]), "indexes_bytes": int(row[1]), "hnsw_bytes": int(row[2]),
            "hnsw_vectors_bytes": int(row[3])}


def measure(pg_url: str | None = None, memories: int = 100_000, queries: int = 100, processes: int = 8,
            per_process: int = 500, seed: int = 0, folder: Path | None = None, rewards_only: bool = False,
            progress: Callable[[str], None] = lambda message: None) -> dict[str, Any]:
    """Every PostgreSQL figure and its SQLite counterpart, in one run (`rewards_only`: ingest and rewards)."""
    from benchmarks.testing.pg_server import temporary_database

    rng = np.random.default_rng(seed)
    params = RetrieveParams(recall="groups")  # the figures of docs/performance.md: the grouped retrieve
    results: dict[str, Any] = {"memories": memories, "dim": 384, "k1": params.k1}
    with server(pg_url or os.environ.get("MEMRL_PERF_PG_URL")) as admin, \
            temporary_database(admin, "memrl_perf") as pg, tempfile.TemporaryDirectory(dir=folder) as scratch:
        sqlite = Path(scratch) / "bank.db"
        with MemoryBank(pg) as bank:
            results["server"] = bank.store.describe()["server_version"]
        vectors = clustered_vectors(rng, memories)
        progress(f"PostgreSQL: ingesting {memories} memories")
        results["ingest_per_s"] = {"postgresql": build_bank(pg, vectors)}
        progress(f"SQLite: ingesting {memories} memories")
        results["ingest_per_s"]["sqlite"] = build_bank(sqlite, vectors)
        locations = {"postgresql": pg, "sqlite": str(sqlite)}
        results["rewards"] = {}
        ids: dict[str, list[int]] = {}
        for engine in ENGINES:
            with MemoryBank(locations[engine]) as bank:
                ids[engine] = [int(r[0]) for r in bank.conn.execute("SELECT id FROM memories ORDER BY id")]
        for mode in MODES:
            for engine in ENGINES:
                progress(f"{engine}: {processes} processes × {per_process} rewards, {mode} memory")
                results["rewards"][f"{engine}_{mode}"] = concurrent_rewards(
                    locations[engine], ids[engine], mode, processes, per_process, rng)
            progress(f"PostgreSQL floor: {processes} processes × {per_process} bare statements, {mode} row")
            results["rewards"][f"floor_{mode}"] = reward_floor(pg, ids["postgresql"], mode, processes, per_process, rng)
        if rewards_only:
            return results
        progress("PostgreSQL: building the HNSW index")
        with MemoryBank(pg) as bank:
            start = time.perf_counter()
            bank.set_index("hnsw")
            results["hnsw_build_s"] = time.perf_counter() - start
        results["pg_sizes"] = table_sizes(pg)
        progress("SQLite: building the sqlite-vec index")
        with MemoryBank(sqlite) as bank:
            start = time.perf_counter()
            bank.set_index("vec")
            results["vec_build_s"] = time.perf_counter() - start
        progress(f"retrieving from {memories} memories on both engines")
        tested = near_queries(rng, vectors, queries)
        results["retrieve"] = knn_latency(pg, sqlite, tested, params)
        # fresh queries from a stream of their own, so that the draws after them match runs without them
        fresh = functools.partial(near_queries, np.random.default_rng([seed, 1]), vectors, queries)
        progress("PostgreSQL: HNSW retrieves one after the other, as a database serves them")
        results["hnsw_serving"] = hnsw_serving(pg, fresh, params, SERVING_BLOCKS)
        progress("PostgreSQL: HNSW recall and latency by ef_search")
        results["hnsw_ef_search"] = hnsw_sweep(pg, tested, fresh, params, EF_SEARCH)
        results["hnsw_ef_search_memories"] = hnsw_sweep(pg, tested, fresh, replace(params, recall="memories"),
                                                        EF_SEARCH)
        progress(f"PostgreSQL with its HNSW index: {processes} processes × {per_process} rewards, random memory")
        before = table_sizes(pg)["hnsw_bytes"]
        results["rewards"]["postgresql_random_hnsw"] = concurrent_rewards(pg, ids["postgresql"], "random", processes,
                                                                          per_process, rng)
        results["rewards"]["postgresql_random_hnsw"]["hnsw_bytes_added"] = table_sizes(pg)["hnsw_bytes"] - before
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", default=None, help="Admin postgresql:// URL of a server with pgvector "
                        "[MEMRL_PERF_PG_URL, else a throwaway local server].")
    parser.add_argument("--memories", type=int, default=100_000, help="Bank size [100000].")
    parser.add_argument("--queries", type=int, default=100, help="Queries timed per retriever, per ef_search, and per set "
                        f"of fresh queries in the HNSW serving measurement ({SERVING_BLOCKS} sets) [100].")
    parser.add_argument("--processes", type=int, default=8, help="Reward processes [8].")
    parser.add_argument("--rewards", type=int, default=500, help="Rewards per process [500].")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rewards-only", action="store_true", help="Only ingest and rewards (no index, no retrieve).")
    parser.add_argument("--dir", default=None, help="Where to put the SQLite bank [a temporary directory].")
    parser.add_argument("--out", default=None, help="Write the figures as JSON here.")
    args = parser.parse_args()
    results = measure(args.pg_url, args.memories, args.queries, args.processes, args.rewards, args.seed,
                      None if args.dir is None else Path(args.dir), args.rewards_only, progress=lambda m: print(m, file=sys.stderr))
    print(json.dumps(results, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
