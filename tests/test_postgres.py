"""A bank on PostgreSQL + pgvector: moving banks between engines, concurrent writers on many
processes, the HNSW index, and the errors a server bank gives (unreachable, empty, read-only).

The engine-agnostic API and CLI tests run on both engines through `bank_at` (tests/conftest.py);
this module holds what only a server bank has.
"""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import error_line, run_memrl
from memrl_cli.ops import hygiene
from memrl_cli.store import migrations as schema
from memrl_cli.bank import MemoryBank
from memrl_cli.bank.embedders import normalise
from memrl_cli.errors import MemrlError
from memrl_cli.ops.inspection import MEMORY_FIELDS, stats, verify
from memrl_cli.method.retrieval import RetrieveParams
from memrl_cli.ops.transfer import LEDGER_FIELDS, export_jsonl, import_jsonl, merge

pytestmark = pytest.mark.postgres

DIM = 16
EMBEDDER = f"external:test:{DIM}"
COMPARED = [f for f in MEMORY_FIELDS if f != "id"]  # ids are the bank's own; memories are matched by intent


@pytest.fixture
def new_pg(pg_server_dsn: str) -> Iterator[Callable[[], str]]:
    """A factory of fresh, empty PostgreSQL databases (URLs), dropped after the test."""
    from benchmarks.testing.pg_server import create_database, drop_database

    made: list[str] = []

    def create() -> str:
        made.append(f"memrl_test_{uuid.uuid4().hex[:8]}")
        return create_database(pg_server_dsn, made[-1])

    yield create
    for name in made:
        drop_database(pg_server_dsn, name)


def closed_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# -- moving a bank between engines -----------------------------------------------------------------


def learned_bank(location: str, seed: int = 0, n: int = 12) -> None:
    """A bank with given vectors, varied fields, receipts, rewards (floored, repeated) and a `set` row."""
    rng = np.random.default_rng(seed)
    vectors = normalise(rng.normal(size=(n, DIM)))
    with MemoryBank(location, EMBEDDER) as bank:
        bank.ingest_many([{"intent": f"task {i} ü", "experience": f"steps {i}\nline two", "vector": v.tolist(),
                           "outcome": ("success", "failure", "unknown")[i % 3], "task_id": f"t{i}" if i % 2 else None,
                           "source": "seed" if i % 4 else None, "q": 0.25 if i == 3 else 0.0,
                           "metadata": {"i": i, "nested": {"list": [1, 2.5, "é"]}}}
                          for i, v in enumerate(vectors)])
        params = RetrieveParams(k1=5, k2=3, threshold=-1.0)
        for r in range(4):
            hit = bank.retrieve(f"query {r}", params, vector=vectors[r * 2].tolist())
            bank.reward(1.0 if r % 2 else -1.0, retrieval_id=hit.id, floor=-0.5, source=f"episode {r}")
        bank.reward(0.5, retrieval_id=hit.id, allow_repeat=True, alpha=0.1)
        bank.reward_many([{"reward": 1.0, "memory_ids": [2, 3]}, {"reward": -0.2, "memory_ids": [3], "alpha": 1.0}])
        bank.set_q(5, 0.42, "manual")


def snapshot(location: str) -> dict[str, dict[str, Any]]:
    """Every memory by intent: its fields, its float32 vector and its ledger rows (every column)."""
    with MemoryBank(location, create=False) as bank:
        ledger_columns = ("retrieval_id", *LEDGER_FIELDS)
        out: dict[str, dict[str, Any]] = {}
        rows = bank.conn.execute(f"SELECT id, {', '.join(COMPARED)}, embedding FROM memories ORDER BY id").fetchall()
        for row in rows:
            memory = dict(zip(COMPARED, row[1:-1]))
            memory["metadata"] = json.loads(memory["metadata"])
            memory["vector"] = bank.store.decode([row[-1]])[0]
            memory["ledger"] = [dict(zip(ledger_columns, r)) for r in bank.conn.execute(
                f"SELECT {', '.join(ledger_columns)} FROM rewards WHERE memory_id = ? ORDER BY id", (row[0],))]
            out[memory["intent"]] = memory
        assert verify(bank)["ok"], verify(bank)
        return out


def assert_same_bank(got: dict[str, dict[str, Any]], want: dict[str, dict[str, Any]], receipts: bool) -> None:
    """Same memories, bit-identical vectors, same ledgers (receipt links only where the receipts came along)."""
    assert got.keys() == want.keys()
    for intent, mine in want.items():
        theirs = got[intent]
        assert {k: theirs[k] for k in COMPARED} == {k: mine[k] for k in COMPARED}, intent
        assert theirs["vector"].dtype == np.float32 and np.array_equal(theirs["vector"], mine["vector"]), intent
        expected = mine["ledger"] if receipts else [{**r, "retrieval_id": None} for r in mine["ledger"]]
        assert theirs["ledger"] == expected, intent


def export_records(location: str) -> list[dict[str, Any]]:
    """A bank's export with vectors, without its header line."""
    buffer = io.StringIO()
    with MemoryBank(location, create=False) as bank:
        export_jsonl(bank, buffer, vectors=True)
    return [json.loads(line) for line in buffer.getvalue().splitlines()[1:]]


def test_sqlite_to_postgres_to_sqlite_round_trip(tmp_path: Path, new_pg: Callable[[], str]) -> None:
    first, server, last = str(tmp_path / "first.db"), new_pg(), str(tmp_path / "last.db")
    learned_bank(first)
    original = snapshot(first)
    assert sum(len(m["ledger"]) for m in original.values()) >= 15
    assert {r["kind"] for m in original.values() for r in m["ledger"]} == {"reward", "set"}
    assert any(r["retrieval_id"] is not None for m in original.values() for r in m["ledger"])

    exported = tmp_path / "first.jsonl"
    run_memrl("export", "--vectors", "-o", str(exported), "--db", first)
    imported = json.loads(run_memrl("import", str(exported), "--embedder", EMBEDDER, "--json", "--db", server).stdout)
    assert imported == {"created": 12, "duplicates": 0, "merged": 0}
    on_server = snapshot(server)
    assert_same_bank(on_server, original, receipts=False)  # receipts stay in their own bank

    exported_again = tmp_path / "server.jsonl"
    run_memrl("export", "--vectors", "-o", str(exported_again), env={"MEMRL_DB": server})
    run_memrl("import", str(exported_again), "--embedder", EMBEDDER, "--db", last)
    assert_same_bank(snapshot(last), on_server, receipts=True)
    assert export_records(first) == export_records(server) == export_records(last)


def comparable(ledger: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ledger rows as two merges of the same banks agree on them: the rows a merge adds carry the
    time of the merge, and receipts stay in their own bank."""
    return [{k: v for k, v in row.items() if k != "retrieval_id"
             and not (k == "created_at" and (row["source"] or "").startswith("merge:"))} for row in ledger]


MERGES = [("sqlite", "sqlite", "postgresql"), ("postgresql", "sqlite", "sqlite")]


@pytest.mark.parametrize("engines", MERGES, ids=["-".join(e) for e in MERGES])
def test_merge_across_engines_equals_the_sqlite_merge(tmp_path: Path, new_pg: Callable[[], str],
                                                      engines: tuple[str, str, str]) -> None:
    a, b = str(tmp_path / "a.db"), str(tmp_path / "b.db")
    learned_bank(a, seed=0, n=12)
    learned_bank(b, seed=0, n=8)  # the same first 8 memories (merged), with their own ledgers
    with MemoryBank(b) as bank:
        bank.ingest("only in b", "x", vector=normalise(np.ones(DIM))[0].tolist())
    reference = str(tmp_path / "reference.db")
    assert merge(a, b, reference) == {"created": 1, "duplicates": 0, "merged": 8}

    def on(engine: str, source: str, name: str) -> str:
        if engine == "sqlite":
            return source
        url = new_pg()
        with MemoryBank(source) as bank, (tmp_path / f"{name}.jsonl").open("w") as out:
            export_jsonl(bank, out, vectors=True)
        with MemoryBank(url, EMBEDDER) as bank, (tmp_path / f"{name}.jsonl").open("rb") as data:
            import_jsonl(bank, data)
        return url

    first, second = on(engines[0], a, "a"), on(engines[1], b, "b")
    output = new_pg() if engines[2] == "postgresql" else str(tmp_path / "merged.db")
    counts = json.loads(run_memrl("merge", first, second, "-o", output, "--json").stdout)
    assert counts == {"created": 1, "duplicates": 0, "merged": 8}
    got, want = snapshot(output), snapshot(reference)
    assert got.keys() == want.keys()
    for intent, mine in want.items():
        theirs = got[intent]
        for field in ("q", "q_init", "visits", "outcome", "task_id", "source", "metadata", "created_at",
                      "last_used_at"):
            assert theirs[field] == mine[field], (intent, field)
        assert np.array_equal(theirs["vector"], mine["vector"])
        assert comparable(theirs["ledger"]) == comparable(mine["ledger"]), intent
    if engines[2] == "postgresql":
        again = run_memrl("merge", a, b, "-o", output, ok=False)
        assert "already holds memories; merge writes a new bank" in error_line(again)


# -- concurrent writers ----------------------------------------------------------------------------

GATE = 0x6D656D7274  # an advisory lock the test holds until every worker is ready

REWARDER = """
import json, random, sys
from memrl_cli.bank import MemoryBank
from memrl_cli.method.retrieval import RetrieveParams
url, worker, n, dim, gate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rng = random.Random(worker)
applied = 0
with MemoryBank(url) as bank:
    bank.conn.execute("SELECT pg_advisory_lock_shared(?)", (gate,))  # wait for the start
    bank.conn.execute("SELECT pg_advisory_unlock_shared(?)", (gate,))
    for i in range(50):
        kind = i % 4
        if kind == 0:  # the hot memory
            updates = bank.reward(rng.choice([-1.0, 1.0]), memory_ids=[1], source=f"w{worker}")
        elif kind == 1:  # several requests in one transaction, the hot memory among them
            updates = bank.reward_many([{"reward": rng.uniform(-1, 1), "memory_ids": rng.sample(range(1, n + 1), 3)},
                                        {"reward": 1.0, "memory_ids": [rng.randint(2, n), 1], "alpha": 0.5}])
        elif kind == 2:
            updates = bank.reward(rng.uniform(-1, 1), memory_ids=rng.sample(range(1, n + 1), 2), floor=-0.5)
        else:  # through a receipt
            hit = bank.retrieve("q", RetrieveParams(k1=5, k2=3, threshold=-1.0),
                                vector=[rng.gauss(0, 1) for _ in range(dim)])
            updates = bank.reward(rng.uniform(-1, 1), retrieval_id=hit.id, source=f"w{worker}")
        applied += len(updates)
print(json.dumps({"applied": applied}))
"""


def wait_for_lock_waiters(url: str, count: int, workers: list[subprocess.Popen[str]]) -> None:
    """Block until `count` sessions of this database wait for a lock (fail if a worker ended first).

    Watched from a connection of its own: inside a transaction, pg_stat_activity does not change."""
    import psycopg

    deadline = time.monotonic() + 120
    with psycopg.connect(url, autocommit=True) as watcher:
        while time.monotonic() < deadline:
            waiting = watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                      "AND wait_event_type = 'Lock'").fetchone()[0]
            if waiting == count:
                return
            ended = [w for w in workers if w.poll() is not None]
            assert not ended, ended[0].communicate()
            time.sleep(0.05)
    pytest.fail(f"the workers never all waited for the lock ({count} expected)")


@pytest.mark.slow
def test_eight_processes_rewarding_lose_no_update(pg_dsn: str) -> None:
    n, dim = 30, 8
    with MemoryBank(pg_dsn, f"external:test:{dim}") as bank:
        rng = np.random.default_rng(0)
        bank.ingest_many([{"intent": f"m{i}", "experience": "x", "vector": v.tolist()}
                          for i, v in enumerate(rng.normal(size=(n, dim)))])
        bank.conn.execute("SELECT pg_advisory_lock(?)", (GATE,))
        workers = [subprocess.Popen([sys.executable, "-c", REWARDER, pg_dsn, str(w), str(n), str(dim), str(GATE)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(8)]
        try:
            wait_for_lock_waiters(pg_dsn, 8, workers)
        finally:
            bank.conn.execute("SELECT pg_advisory_unlock(?)", (GATE,))
        results = [w.communicate(timeout=300) for w in workers]
        assert [w.returncode for w in workers] == [0] * 8, [err for _, err in results]
        applied = sum(json.loads(out)["applied"] for out, _ in results)
        assert applied >= 8 * 50
        visits, ledger = bank.conn.execute("SELECT (SELECT sum(visits) FROM memories), "
                                           "(SELECT count(*) FROM rewards)").fetchone()
        assert visits == ledger == applied
        hot = bank.conn.execute("SELECT visits FROM memories WHERE id = 1").fetchone()[0]
        assert hot >= 8 * (13 + 13)  # every worker's hot rewards, and its reward_many rows on memory 1
        report = verify(bank)
        assert report["ok"], report["problems"]
        assert report["ledger_rows"] == applied


SAME_RECEIPT = """
import json, sys
from memrl_cli.bank import MemoryBank
from memrl_cli.errors import MemrlError
with MemoryBank(sys.argv[1]) as bank:
    try:
        print(json.dumps({"updated": bank.reward(1.0, retrieval_id=int(sys.argv[2]))}))
    except MemrlError as exc:
        print(json.dumps({"error": str(exc)}))
"""


def test_two_processes_rewarding_one_receipt_one_wins(pg_dsn: str) -> None:
    with MemoryBank(pg_dsn, "external:test:4") as bank:
        bank.ingest_many([{"intent": f"m{i}", "experience": "x", "vector": [1.0, i, 0.0, 1.0]} for i in range(4)])
        hit = bank.retrieve("q", RetrieveParams(k1=4, k2=2, threshold=-1.0), vector=[1.0, 1.0, 0.0, 1.0])
        bank.conn.execute("BEGIN")  # hold the receipt's row lock until both workers wait for it
        bank.conn.execute("SELECT id FROM retrievals WHERE id = ? FOR UPDATE", (hit.id,)).fetchall()
        workers = [subprocess.Popen([sys.executable, "-c", SAME_RECEIPT, pg_dsn, str(hit.id)], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for _ in range(2)]
        try:
            wait_for_lock_waiters(pg_dsn, 2, workers)
        finally:
            bank.conn.execute("ROLLBACK")
        results = [w.communicate(timeout=120) for w in workers]
        assert [w.returncode for w in workers] == [0, 0], [err for _, err in results]
        outcomes = sorted((json.loads(out) for out, _ in results), key=lambda o: "error" in o)
        assert [m["id"] for m in outcomes[0]["updated"]] == [m["id"] for m in hit.memories]
        assert f"retrieval {hit.id} was already rewarded" in outcomes[1]["error"]
        assert bank.conn.execute("SELECT count(*), sum(visits) FROM rewards JOIN memories m ON m.id = memory_id"
                                 ).fetchone() == (2, 2)
        assert verify(bank)["ok"]


def test_servers_storing_and_rewarding_tasks_at_once_never_deadlock(pg_dsn: str) -> None:
    """Proxies store receipts under task keys (one key shared), keep their tasks current and reward them, all on
    one memory at once: every write goes through, none is failed by the server as one side of a deadlock."""
    import threading

    from memrl_cli.serving.service import BankService

    with MemoryBank(pg_dsn) as bank:
        bank.ingest("heat an egg", "SCRIPT: boil it", "success")
    service = BankService(pg_dsn, busy_timeout=60)
    errors: list[str] = []

    def proxy(worker: int) -> None:
        try:
            for i in range(6):
                retrieval = service.select("heat an egg", RetrieveParams())
                rid = service.record(retrieval, ("shared" if i % 2 else f"w{worker}", 1), 3600)
                service.touch_tasks([(f"w{worker}", rid, 2), ("shared", rid, 2)])
                service.reward([{"retrieval_id": rid, "reward": 1}])
        except MemrlError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=proxy, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    service.close()
    assert errors == []
    with MemoryBank(pg_dsn, create=False) as bank:
        assert bank.conn.execute("SELECT visits, (SELECT count(*) FROM rewards) FROM memories").fetchone() == (48, 48)
        assert verify(bank)["ok"]


# -- the HNSW index --------------------------------------------------------------------------------


def vector_searches(bank: MemoryBank, monkeypatch: pytest.MonkeyPatch, query: np.ndarray) -> list[tuple[str, tuple]]:
    """The (SQL, arguments) of the vector searches one retrieval sends to the server (psycopg's dialect)."""
    seen: list[tuple[str, tuple]] = []
    cursor = type(bank.store.conn.raw.cursor())
    execute = cursor.execute

    def recording(self: Any, sql: str, args: Any = None, **kwargs: Any) -> Any:
        if "<=>" in str(sql):
            seen.append((str(sql), tuple(args or ())))
        return execute(self, sql, args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(cursor, "execute", recording)
        bank.retrieve("q", RetrieveParams(k1=10, threshold=-1.0), vector=query.tolist(), record=False)
    return seen


def search_plan(bank: MemoryBank, monkeypatch: pytest.MonkeyPatch, query: np.ndarray) -> str:
    """The server's plan (EXPLAIN, one line) of the one vector search a retrieval of `query` sends."""
    [(sql, args)] = vector_searches(bank, monkeypatch, query)
    return " ".join(r[0] for r in bank.store.conn.raw.execute("EXPLAIN " + sql, args).fetchall())


def test_hnsw_recall_stats_and_drop(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    centres = normalise(rng.normal(size=(50, 32)))
    vectors = normalise(centres[rng.integers(0, 50, 2000)] + 0.15 * rng.normal(size=(2000, 32)))
    queries = normalise(centres + 0.15 * rng.normal(size=(50, 32)))
    with MemoryBank(pg_dsn, "external:test:32") as bank:
        bank.ingest_many([{"intent": f"m{i}", "experience": "x", "vector": v.tolist()} for i, v in enumerate(vectors)])
        assert bank.store.index_info()["kind"] == "exact"
        assert bank.set_index("hnsw")["kind"] == "hnsw"
    assert json.loads(run_memrl("inspect", "--stats", "--json", "--db", pg_dsn).stdout)["index"]["kind"] == "hnsw"

    with MemoryBank(pg_dsn, index="hnsw") as hnsw, MemoryBank(pg_dsn, index="exact") as exact:
        for bank in (hnsw, exact):  # a 2,000-row table is cheaper to scan: make the planner use the index if it can
            bank.conn.execute("SET enable_seqscan = off")
        plans = {}
        for name, bank in (("hnsw", hnsw), ("exact", exact)):
            plans[name] = search_plan(bank, monkeypatch, queries[0])
        assert "memory_vectors_hnsw" in plans["hnsw"] and "hnsw" not in plans["exact"], plans

        for k1 in (10, 250):  # 250 > hnsw.ef_search (200): iterative scans still return k1 candidates
            params = RetrieveParams(k1=k1, k2=3, threshold=-1.0, recall="memories")  # index recall, per memory
            found = 0
            for query in queries:
                approximate = [c.memory_id for c in hnsw.retrieve("q", params, vector=query.tolist(),
                                                                  record=False).candidates]
                truth = {c.memory_id for c in exact.retrieve("q", params, vector=query.tolist(),
                                                             record=False).candidates}
                assert len(approximate) == len(truth) == k1
                found += len(truth.intersection(approximate))
            assert found / (k1 * len(queries)) >= 0.95, (k1, found)

    with MemoryBank(pg_dsn) as bank:
        assert bank.set_index("exact") == {"kind": "exact"}
        assert bank.conn.execute("SELECT count(*) FROM pg_indexes WHERE indexdef LIKE '%hnsw%'").fetchone()[0] == 0
        assert bank.conn.execute("SELECT to_regclass('memory_vectors'), (SELECT count(*) FROM pg_trigger WHERE "
                                 "tgname = 'memories_copy_vectors')").fetchone() == (None, 0)
        assert stats(bank)["index"] == {"kind": "exact"}
        assert verify(bank)["ok"]


def hnsw_indexes(bank: MemoryBank) -> dict[str, str]:
    """{index name: the table it indexes} for the bank's HNSW indexes."""
    return dict(bank.conn.execute("SELECT indexname, tablename FROM pg_indexes WHERE indexdef LIKE '%USING hnsw%'"))


def test_the_hnsw_graph_indexes_a_copy_that_rewards_and_receipts_never_rewrite(pg_dsn: str,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A reward or a receipt writes a new version of the memory row; were the graph on `memories`, each would
    be a graph insertion. The graph is on `memory_vectors`, which a trigger fills with every new memory, also
    one ingested after the index was built, by another connection."""
    rng = np.random.default_rng(3)
    vectors = normalise(rng.normal(size=(60, 16)))
    with MemoryBank(pg_dsn, "external:test:16") as bank, MemoryBank(pg_dsn, "external:test:16") as other:
        bank.ingest_many([{"intent": f"m{i}", "experience": "x", "vector": v.tolist()} for i, v in enumerate(vectors[:50])])
        bank.set_index("hnsw")
        other.ingest_many([{"intent": f"n{i}", "experience": "x", "vector": v.tolist()}
                           for i, v in enumerate(vectors[50:])])
        assert hnsw_indexes(bank) == {"memory_vectors_hnsw": "memory_vectors"}
        copied = bank.conn.execute("SELECT count(*) FROM memory_vectors v JOIN memories m USING (id) "
                                   "WHERE v.embedding = m.embedding").fetchone()[0]
        assert copied == bank.count() == 60
        rows = "SELECT array_agg(ctid::text ORDER BY id) FROM {}"
        before = [bank.conn.execute(rows.format(t)).fetchone()[0] for t in ("memories", "memory_vectors")]
        with MemoryBank(pg_dsn, index="hnsw") as hnsw:
            for v in vectors[45:55]:  # memories from before and after the build, found by the graph
                hit = hnsw.retrieve("q", RetrieveParams(k1=3, k2=1, threshold=-1.0), vector=v.tolist())
                assert hit.candidates[0].similarity == pytest.approx(1.0)
                hnsw.reward(1.0, retrieval_id=hit.id)
            hnsw.reward(-1.0, memory_ids=[1])
        after = [bank.conn.execute(rows.format(t)).fetchone()[0] for t in ("memories", "memory_vectors")]
        assert after[0] != before[0] and after[1] == before[1]  # new memory row versions; the graph's copy as it was
        assert verify(bank)["ok"]
        hygiene.quarantine(bank, [51])  # a filtered search joins the copy to memories, still through the graph
        with MemoryBank(pg_dsn, index="hnsw") as hnsw:
            for setting in ("enable_seqscan", "enable_sort"):  # 60 rows are cheaper to scan and sort
                hnsw.conn.execute(f"SET {setting} = off")
            plan = search_plan(hnsw, monkeypatch, vectors[50])
            assert "memory_vectors_hnsw" in plan and "Join" in plan, plan
            found = hnsw.retrieve("q", RetrieveParams(k1=5, threshold=-1.0), vector=vectors[50].tolist(), record=False)
            assert 51 not in [c.memory_id for c in found.candidates] and len(found.candidates) == 5


def test_verify_finds_a_broken_copy_of_the_vectors_and_building_again_mends_it(pg_dsn: str) -> None:
    """A disabled copy trigger (e.g. a restore with --disable-triggers) leaves new memories out of the graph:
    `inspect --verify` says so, and building the index again re-enables the trigger and copies them."""
    vectors = normalise(np.random.default_rng(6).normal(size=(12, 16)))
    with MemoryBank(pg_dsn, "external:test:16") as bank:
        bank.ingest_many([{"intent": f"m{i}", "experience": "x", "vector": v.tolist()} for i, v in enumerate(vectors[:10])])
        bank.set_index("hnsw")
        assert verify(bank)["ok"]
        bank.conn.execute("ALTER TABLE memories DISABLE TRIGGER memories_copy_vectors")
        bank.ingest_many([{"intent": f"n{i}", "experience": "x", "vector": v.tolist()} for i, v in enumerate(vectors[10:])])
        problems = verify(bank)["problems"]
        assert len(problems) == 2 and "missing or disabled" in problems[0] and "has 10 for 12 memories" in problems[1]
        bank.set_index("hnsw")
        assert verify(bank)["ok"]
        bank.ingest_many([{"intent": "o", "experience": "x", "vector": vectors[0].tolist()}])
        assert bank.conn.execute("SELECT count(*) FROM memory_vectors").fetchone()[0] == bank.count() == 13


def test_a_client_searches_on_when_another_drops_or_builds_the_hnsw_index(pg_dsn: str) -> None:
    """A client opened with `index="hnsw"` follows the graph another client drops (an exact scan of memories
    then) or builds again (its own table)."""
    rng = np.random.default_rng(5)
    vectors = normalise(rng.normal(size=(30, 16)))
    params = RetrieveParams(k1=3, k2=1, threshold=-1.0, recall="memories")
    with MemoryBank(pg_dsn, "external:test:16", index="hnsw") as bank:
        bank.ingest_many([{"intent": f"m{i}", "experience": "x", "vector": v.tolist()} for i, v in enumerate(vectors)])
        with MemoryBank(pg_dsn, index="hnsw") as searcher, MemoryBank(pg_dsn) as admin:
            for change in (None, "exact", "hnsw"):
                if change:
                    admin.set_index(change)
                hit = searcher.retrieve("q", params, vector=vectors[7].tolist(), record=False)
                assert hit.candidates[0].memory_id == 8, change
                assert searcher.store.graph_table() == ("memories" if change == "exact" else "memory_vectors")


def test_a_bank_indexed_before_keeps_its_graph_on_memories_until_the_index_is_built_again(pg_dsn: str) -> None:
    """Banks whose HNSW index was built on `memories` (memrl before 2026-11-26) are searched through it; building
    the index again moves the graph to `memory_vectors`, with the same answers."""
    rng = np.random.default_rng(4)
    vectors = normalise(rng.normal(size=(40, 16)))
    params = RetrieveParams(k1=5, k2=3, threshold=-1.0, recall="memories")
    with MemoryBank(pg_dsn, "external:test:16") as bank:
        bank.ingest_many([{"intent": f"m{i}", "experience": "x", "vector": v.tolist()} for i, v in enumerate(vectors)])
        with bank.transaction():  # as the earlier build left a bank
            bank.conn.execute("CREATE INDEX memories_hnsw ON memories USING hnsw (embedding vector_cosine_ops)")
            bank.store.set_meta("index", {"kind": "hnsw", "ef_search": 200, "dim": 16})
    answers = []
    for rebuild in (False, True):
        with MemoryBank(pg_dsn, index="hnsw") as bank:
            if rebuild:
                bank.set_index("hnsw")
            assert hnsw_indexes(bank) == ({"memory_vectors_hnsw": "memory_vectors"} if rebuild
                                          else {"memories_hnsw": "memories"})
            answers.append([[c.memory_id for c in bank.retrieve("q", params, vector=v.tolist(), record=False).candidates]
                            for v in vectors[:10]])
    assert answers[0] == answers[1]
    assert [a[0] for a in answers[1]] == list(range(1, 11))


# -- errors ------------------------------------------------------------------------------------------


def test_an_unreachable_server_is_one_line_without_the_password() -> None:
    port = closed_port()
    url = f"postgresql://memrl:s3cret-pw@127.0.0.1:{port}/bank"
    with pytest.raises(MemrlError) as caught:
        MemoryBank(url)
    message = str(caught.value)
    assert f"postgresql://memrl:***@127.0.0.1:{port}/bank" in message and "refused" in message
    assert "s3cret-pw" not in message and "\n" not in message
    line = error_line(run_memrl("inspect", "--stats", env={"MEMRL_DB": url}, ok=False))
    assert f"127.0.0.1:{port}" in line and "s3cret-pw" not in line
    query_password = f"postgresql://memrl@127.0.0.1:{port}/bank?password=s3cret-pw"
    line = error_line(run_memrl("retrieve", "apple", "--db", query_password, ok=False))
    assert "password=***" in line and "s3cret-pw" not in line


def test_a_password_never_shows_in_paths_stats_or_doctor(pg_dsn: str) -> None:
    url = pg_dsn.replace("postgres@", "postgres:s3cret-pw@")  # the test server trusts local connections
    with MemoryBank(url, EMBEDDER) as bank:
        bank.ingest("a", "b", vector=normalise(np.ones(DIM))[0].tolist())
        assert "s3cret-pw" not in bank.path and ":***@" in bank.path
        assert "s3cret-pw" not in json.dumps(stats(bank))
    doctor = run_memrl("doctor", "--json", "--db", url)
    assert "s3cret-pw" not in doctor.stdout + doctor.stderr
    report = json.loads(doctor.stdout)
    assert report["engine"] == "postgresql" and report["ok"]
    assert tuple(map(int, report["pgvector"].split("."))) >= (0, 8)


def test_an_empty_database_is_not_a_bank_unless_created(pg_dsn: str) -> None:
    for options in ({"create": False}, {"readonly": True}):
        with pytest.raises(MemrlError, match=f"no memrl bank at schema {schema.LATEST} in postgresql://"):
            MemoryBank(pg_dsn, **options)
    line = error_line(run_memrl("retrieve", "apple", "--db", pg_dsn, ok=False))
    assert "no memrl bank" in line and "memrl ingest" in line
    import psycopg

    with psycopg.connect(pg_dsn) as conn:  # nothing was created by the refused opens
        assert conn.execute("SELECT to_regclass('memrl_schema'), to_regclass('memories')").fetchone() == (None, None)


@pytest.mark.parametrize("index", ["numpy", "bit", "vec"])
def test_sqlite_only_indexes_are_refused(pg_dsn: str, index: str) -> None:
    with pytest.raises(MemrlError, match=f"index={index} is not available for a postgresql bank; "
                                         "use one of auto, exact, hnsw"):
        MemoryBank(pg_dsn, index=index)


def test_backup_of_a_server_bank_is_refused(pg_dsn: str, tmp_path: Path) -> None:
    with MemoryBank(pg_dsn, EMBEDDER) as bank:
        bank.ingest("a", "b", vector=normalise(np.ones(DIM))[0].tolist())
    done = run_memrl("backup", str(tmp_path / "copy.db"), "--db", pg_dsn, ok=False)
    assert done.returncode == 1 and "pg_dump" in error_line(done)
    assert not (tmp_path / "copy.db").exists()
    as_json = run_memrl("backup", str(tmp_path / "copy.db"), "--json", "--db", pg_dsn, ok=False)
    assert json.loads(as_json.stdout)["error"]["message"].startswith("`memrl backup` copies a SQLite bank")


def test_a_readonly_bank_refuses_writes(pg_dsn: str) -> None:
    vector = normalise(np.ones(DIM))[0].tolist()
    with MemoryBank(pg_dsn, EMBEDDER) as bank:
        bank.ingest("a", "b", vector=vector)
    with MemoryBank(pg_dsn, readonly=True) as bank:
        hit = bank.retrieve("q", RetrieveParams(threshold=-1.0), vector=vector, record=False)
        assert [m["intent"] for m in hit.memories] == ["a"]
        writes: list[Callable[[], Any]] = [
            lambda: bank.ingest("c", "d", vector=vector), lambda: bank.reward(1.0, memory_ids=[1]),
            lambda: bank.set_q(1, 0.5, "x"), lambda: bank.calibrate(mean=0.1, std=0.1),
            lambda: bank.set_index("hnsw"), lambda: bank.retrieve("q", vector=vector)]
        for write in writes:
            with pytest.raises(MemrlError, match="opened read-only"):
                write()
        import psycopg

        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):  # the session itself is read-only too
            bank.conn.execute("UPDATE memories SET q = 1")
    with pytest.raises(MemrlError, match="has no hnsw index; open it writable"):
        MemoryBank(pg_dsn, readonly=True, index="hnsw")
    with MemoryBank(pg_dsn) as bank:
        assert bank.conn.execute("SELECT count(*), sum(q), sum(visits) FROM memories").fetchone() == (1, 0.0, 0)
        assert bank.conn.execute("SELECT count(*) FROM rewards").fetchone()[0] == 0


@pytest.mark.parametrize("value", ['{"kind": "hnsw", "ef_search": "100; DROP TABLE memories"}',
                                   '{"kind": "hnsw", "ef_search": 0}', '{"kind": "ivf"}'])
def test_an_altered_index_setting_is_refused(pg_dsn: str, value: str) -> None:
    with MemoryBank(pg_dsn, EMBEDDER) as bank:
        bank.ingest("a", "b", vector=normalise(np.ones(DIM))[0].tolist())
        bank.conn.execute("INSERT INTO meta (key, value) VALUES ('index', ?)", (value,))
    with pytest.raises(MemrlError, match="refusing to open this bank: its meta value 'index'"):
        MemoryBank(pg_dsn)


def test_vectors_are_kept_in_the_row(pg_dsn: str) -> None:
    """Out-of-line (TOAST) vectors made exact search 4x slower at 100k (benchmarks/perf/pg_perf.py)."""
    with MemoryBank(pg_dsn, EMBEDDER) as bank:
        bank.ingest("a", "b" * 3000, vector=normalise(np.ones(DIM))[0].tolist())
        storage, typmod = bank.conn.execute("SELECT attstorage, atttypmod FROM pg_attribute WHERE attrelid = "
                                            "'memories'::regclass AND attname = 'embedding'").fetchone()
        assert (storage, typmod) == ("m", DIM)


def test_bulk_ingest_gives_the_sqlite_ids_and_duplicates(pg_dsn: str, tmp_path: Path) -> None:
    """COPY-based ingest: ids ascend in input order; repeats inside the batch and of stored memories
    are reported as on SQLite; a later batch in the same transaction starts from an empty staging table.
    (PostgreSQL's identity skips the numbers of refused duplicates, so ids are compared by rank.)"""
    rng = np.random.default_rng(1)
    first = [{"intent": f"i{k}", "experience": "e", "vector": rng.normal(size=DIM).tolist()} for k in range(5)]
    second = [first[3], *[{"intent": f"j{k}", "experience": "e", "vector": rng.normal(size=DIM).tolist()}
                          for k in range(3)], first[0], {**first[1], "experience": "other"}]
    second.insert(2, second[1])  # a repeat inside the batch
    outcomes = []
    for location in (pg_dsn, str(tmp_path / "b.db")):
        with MemoryBank(location, EMBEDDER) as bank:
            with bank.transaction():
                one = bank.ingest_many(first)
                two = bank.ingest_many(second)
            stored = bank.conn.execute("SELECT id, intent, experience FROM memories ORDER BY id").fetchall()
            rank = {row[0]: n for n, row in enumerate(stored)}
            outcomes.append(([(rank[r.id], r.created) for r in one + two], [tuple(row[1:]) for row in stored]))
    assert outcomes[0] == outcomes[1]
    assert [c for _, c in outcomes[0][0][5:]] == [False, True, False, True, True, False, True]


def test_one_statement_rewards_equal_the_sqlite_rule(pg_dsn: str, tmp_path: Path) -> None:
    """Floor and alpha as on SQLite, to the last bit, for one memory (REWARD_ONE_SQL, also through a receipt
    that selected one) and several (REWARD_SQL, alone or in runs inside a transaction), also once the
    statements are prepared (psycopg prepares on a statement's sixth call) and run with their generic plans
    (REWARD_SQL's never with a custom one); inside a caller's transaction the plan setting is back to the
    default after a reward. An unknown id, or a request psycopg refuses (NUL in text), changes nothing, and the
    next reward goes through."""
    requests = [{"reward": 1.0, "memory_ids": [2, 1], "alpha": 0.3},
                {"reward": -1.0, "memory_ids": [3], "alpha": 0.7, "floor": -0.25},
                {"reward": -1.0, "memory_ids": [1, 3], "alpha": 1.0, "floor": 0.1},
                {"reward": 0.37, "memory_ids": [2], "alpha": 0.05, "source": "s"}]
    shared = [{"reward": 1.0, "memory_ids": [1, 2], "floor": -0.2}, {"reward": -1.0, "memory_ids": [2, 3], "floor": -0.2}]
    results = []
    for location in (pg_dsn, str(tmp_path / "b.db")):
        with MemoryBank(location, EMBEDDER) as bank:
            bank.ingest_many([{"intent": f"m{k}", "experience": "e", "q": 0.1 * k,
                               "vector": np.eye(DIM)[k].tolist()} for k in range(3)])
            applied = [bank.reward_many([r]) for r in requests * 3] + [bank.reward_many(requests[:2])]
            applied += [bank.reward(0.5 - k % 2, memory_ids=[1, 2], floor=-0.2) for k in range(8)]
            applied += [bank.reward(0.5 - k % 2, memory_ids=[3], floor=-0.2) for k in range(12)]
            applied += [bank.reward_many(shared) for _ in range(8)]  # memory 2 twice: runs in a transaction
            for k in range(3):
                hit = bank.retrieve("q", RetrieveParams(k1=3, k2=1, threshold=-1.0), vector=np.eye(DIM)[k].tolist())
                applied.append(bank.reward(1.0 - k, retrieval_id=hit.id))
            with bank.transaction():
                applied.append(bank.reward_many(shared))
                if location == pg_dsn:
                    assert bank.conn.execute("SHOW plan_cache_mode").fetchone()[0] == "auto"
            with pytest.raises(MemrlError, match="unknown memory id 99"):
                bank.reward(1.0, memory_ids=[1, 99])
            with pytest.raises(MemrlError, match="unknown memory id 99"):
                bank.reward(1.0, memory_ids=[99])
            if location == pg_dsn:
                plans = bank.store.conn.raw.execute(
                    "SELECT statement LIKE %s, generic_plans, custom_plans FROM pg_prepared_statements "
                    "WHERE statement LIKE %s", ("%unnest%", "%INSERT INTO rewards%")).fetchall()
                many = [(g, c) for is_many, g, c in plans if is_many]
                assert many and all(c == 0 for _, c in many) and any(g for g, _ in many), plans  # SET LOCAL
                assert any(g for is_many, g, _ in plans if not is_many), plans  # PostgreSQL's own choice
                with pytest.raises(MemrlError, match="NUL"):
                    bank.reward(1.0, memory_ids=[1, 2], source="a\x00b")  # PostgreSQL text cannot hold it
                with pytest.raises(MemrlError, match="NUL"):
                    bank.reward(1.0, memory_ids=[1], source="a\x00b")
            applied.append(bank.reward(-1.0, memory_ids=[1]))
            ledger = bank.conn.execute("SELECT retrieval_id, memory_id, reward, alpha, q_floor, q_before, q_after, "
                                       "source FROM rewards ORDER BY id").fetchall()
            results.append((applied, [tuple(row) for row in ledger]))
            assert verify(bank)["ok"]
    assert results[0] == results[1]
    assert sum(row[0] is not None for row in results[0][1]) == 3


def test_meta_is_read_once_per_retrieve_and_follows_other_writers(pg_dsn: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A retrieve reads the change counter once, not every meta value; a change made through another
    bank object (another process's connection) is seen on the next call."""
    vectors = normalise(np.random.default_rng(2).normal(size=(20, DIM)).astype(np.float32))
    with MemoryBank(pg_dsn, EMBEDDER) as writer, MemoryBank(pg_dsn, EMBEDDER) as reader:
        writer.ingest_many([{"intent": f"m{k}", "experience": "e", "vector": v.tolist()}
                            for k, v in enumerate(vectors[:10])])
        reader.retrieve("q", vector=vectors[0].tolist(), record=False)
        cursor = type(reader.store.conn.raw.cursor())
        execute = cursor.execute
        statements: list[str] = []

        def recording(self: Any, sql: str, args: Any = None, **kwargs: Any) -> Any:
            statements.append(str(sql))
            return execute(self, sql, args, **kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(cursor, "execute", recording)
            reader.retrieve("q", vector=vectors[0].tolist(), record=False)
        assert [s for s in statements if "FROM meta" in s] == [statements[0]]  # the counter, once
        assert len(statements) == 3  # counter, KNN with the neighbours' vectors (grouped recall), candidates' rows
        writer.calibrate(mean=0.5, std=0.25)
        assert reader.similarity_stats() == (0.5, 0.25)
        assert reader.count() == 10
        writer.ingest_many([{"intent": f"n{k}", "experience": "e", "vector": v.tolist()}
                            for k, v in enumerate(vectors[10:])])
        assert reader.count() == 20
        writer.set_index("hnsw")
        assert reader.retrieve("q", vector=vectors[0].tolist(), record=False).memories
        assert reader._cache["index_kind"] == "hnsw"
        writer.calibrate(clear=True)
        assert reader.similarity_stats() != (0.5, 0.25)
