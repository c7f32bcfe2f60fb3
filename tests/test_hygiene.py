"""Memory hygiene for shared banks: quarantine and release, `retrieve --source`, reset-q and undo.

Every test takes `bank_at`, so it runs on SQLite and on PostgreSQL; retrieval is checked on each
of the engine's Phase-A indexes (SQLite: numpy, bit, sqlite-vec; PostgreSQL: exact, HNSW).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable

import numpy as np
import pytest
from test_cli import as_json, error_line, memrl, table_state

from memrl_cli.ops import hygiene
from memrl_cli.store import sqlite
from memrl_cli.ops import transfer
from memrl_cli.bank import MemoryBank
from memrl_cli.errors import MemrlError
from memrl_cli.ops.inspection import memory as memory_view
from memrl_cli.ops.inspection import stats, top_q, verify
from memrl_cli.method.learning import q_update
from memrl_cli.method.retrieval import RetrieveParams

DIM = 16
SOURCES = ["run:a", "run:b", "evil", None, "50%_x", "a[1]", "Run:c"]


def make_bank(location: str, n: int, seed: int = 0) -> np.ndarray:
    """`n` memories with random unit vectors; memory i (id i + 1) has source SOURCES[i % 7]."""
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    with MemoryBank(location, f"external:test:{DIM}") as bank:
        bank.ingest_many([{"intent": f"task {i}", "experience": f"did {i}", "source": SOURCES[i % len(SOURCES)],
                           "vector": v.tolist()} for i, v in enumerate(vectors)])
    return vectors


def engine_indexes(location: str) -> list[str]:
    with MemoryBank(location, create=False) as bank:
        return [i for i in bank.store.indexes if i != "auto"]


def phase_a_ids(location: str, index: str, query: np.ndarray, k1: int, sources: tuple[str, ...] = ()) -> list[int]:
    with MemoryBank(location, create=False, index=index) as bank:
        params = RetrieveParams(k1=k1, k2=k1, threshold=-1.0, sources=sources)
        return [c.memory_id for c in bank.retrieve("q", params, vector=query.tolist(), record=False).candidates]


def exact_top(vectors: np.ndarray, query: np.ndarray, k1: int, eligible: set[int]) -> list[int]:
    sims = vectors @ query
    order = [int(i) + 1 for i in np.lexsort((np.arange(len(sims)), -sims)) if int(i) + 1 in eligible]
    return order[:k1]


APPROXIMATE = {"bit", "hnsw"}


@pytest.mark.parametrize("n", [60, 1500])  # 1500: past the bit index's shortlist, so its Hamming pass runs
def test_quarantined_memories_are_never_candidates_on_any_index(bank_at: Callable[[str], str], n: int) -> None:
    db = bank_at("q")
    vectors = make_bank(db, n)
    query = vectors[0] + 0.1 * vectors[1]
    k1 = 20
    nearest = exact_top(vectors, query, 10, set(range(1, n + 1)))  # quarantine the 10 best matches
    with MemoryBank(db, create=False) as bank:
        assert hygiene.quarantine(bank, nearest, reason="poisoned", actor="tester") == {"changed": nearest,
                                                                                         "unchanged": []}
        assert hygiene.quarantine(bank, nearest[:2]) == {"changed": [], "unchanged": nearest[:2]}
        assert bank.quarantined().tolist() == sorted(nearest)
        assert verify(bank)["ok"] and stats(bank)["quarantined"] == 10
    eligible = set(range(1, n + 1)) - set(nearest)
    for index in engine_indexes(db):
        found = phase_a_ids(db, index, query, k1)
        assert not set(found) & set(nearest), index
        if index in APPROXIMATE:
            assert len(found) == k1 and set(found) <= eligible
        else:
            assert found == exact_top(vectors, query, k1, eligible), index
    with MemoryBank(db, create=False) as bank:
        assert hygiene.release(bank, nearest, reason="false alarm")["changed"] == nearest
        assert bank.quarantined().tolist() == []
    for index in engine_indexes(db):
        found = phase_a_ids(db, index, query, k1)
        assert set(nearest) <= set(found), index  # back, as the best matches
        if index not in APPROXIMATE:
            assert found == exact_top(vectors, query, k1, set(range(1, n + 1)))


def test_sqlite_vec_excludes_many_quarantined_by_its_prefilter(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """More quarantined memories than sqlite-vec's k can over-fetch: the IN pre-filter takes over."""
    db = str(tmp_path / "vec.db")
    vectors = make_bank(db, 80)
    query = vectors[3]
    nearest = exact_top(vectors, query, 30, set(range(1, 81)))
    with MemoryBank(db, create=False) as bank:
        hygiene.quarantine(bank, nearest)
    monkeypatch.setattr(sqlite, "KNN_MAX", 32)  # k1 + 30 hidden > 32
    found = phase_a_ids(db, "vec", query, 10)
    assert found == exact_top(vectors, query, 10, set(range(1, 81)) - set(nearest))


@pytest.mark.parametrize("patterns, allowed", [
    (("run:*",), {"run:a", "run:b"}),
    (("evil", "run:b"), {"evil", "run:b"}),
    (("50%_x",), {"50%_x"}),  # LIKE's and GLOB's own wildcards are literal
    (("a[1]",), {"a[1]"}),
    (("run:?",), {"run:a", "run:b"}),
    (("*",), {s for s in SOURCES if s}),  # a memory without a source is never trusted
    (("nobody",), set()),
])
def test_retrieve_only_from_trusted_sources_on_any_index(bank_at: Callable[[str], str], patterns: tuple[str, ...],
                                                         allowed: set[str]) -> None:
    db = bank_at("s")
    n = 70
    vectors = make_bank(db, n)
    with MemoryBank(db, create=False) as bank:
        hygiene.quarantine(bank, [2])  # run:b: quarantine still applies under a source filter
    eligible = {i + 1 for i in range(n) if SOURCES[i % len(SOURCES)] in allowed} - {2}
    query = vectors[1]
    for index in engine_indexes(db):
        found = phase_a_ids(db, index, query, 15, patterns)
        assert set(found) <= eligible, index
        if index not in APPROXIMATE:
            assert found == exact_top(vectors, query, 15, eligible), index


def test_sources_are_recorded_in_the_receipt(bank_at: Callable[[str], str]) -> None:
    db = bank_at("r")
    vectors = make_bank(db, 10)
    with MemoryBank(db, create=False) as bank:
        hit = bank.retrieve("q", RetrieveParams(threshold=-1, sources="run:*"), vector=vectors[0].tolist())
        assert json.loads(bank.conn.execute("SELECT params FROM retrievals WHERE id = ?",
                                            (hit.id,)).fetchone()[0])["sources"] == ["run:*"]
    with pytest.raises(MemrlError, match="sources must be non-empty source patterns"):
        RetrieveParams(sources=("",))


def ledger_sources(bank: MemoryBank, memory_id: int) -> list[tuple[str, str | None]]:
    return [(r["kind"], r["source"]) for r in memory_view(bank, memory_id)["ledger"]]


def test_undo_replays_the_ledger_without_the_undone_rewards(bank_at: Callable[[str], str]) -> None:
    db = bank_at("u")
    make_bank(db, 3)
    with MemoryBank(db, create=False) as bank:
        steps = [(1.0, "judge-a"), (-1.0, "judge-b"), (1.0, "judge-a"), (0.5, "judge-b")]
        for r, source in steps:
            bank.reward(r, memory_ids=[1], source=source)
        bank.reward(1.0, memory_ids=[2], source="judge-b")
        q_all = bank.conn.execute("SELECT q FROM memories WHERE id = 1").fetchone()[0]
        before = table_state(db)
        preview = hygiene.undo(bank, source="judge-a", dry_run=True)
        assert table_state(db) == before  # a dry run writes nothing
        report = hygiene.undo(bank, source="judge-a", reason="judge-a was gamed", actor="ops")
        assert {k: v for k, v in report.items() if k != "dry_run"} == \
            {k: v for k, v in preview.items() if k != "dry_run"}
        expected = q_update(q_update(0.0, -1.0, 0.3), 0.5, 0.3)  # only judge-b's rewards, in order
        assert report["undone"] == 2 and report["reapplied"] == 2 and report["superseded"] == 0
        assert report["memories"] == [{"id": 1, "q_before": q_all, "q_after": pytest.approx(expected),
                                       "undone": 2, "reapplied": 2}]
        row = bank.conn.execute("SELECT q, visits FROM memories WHERE id = 1").fetchone()
        assert row[0] == pytest.approx(expected) and row[1] == 2
        assert ledger_sources(bank, 1)[4:] == [("set", "undo source=judge-a by ops: judge-a was gamed"),
                                               ("reward", "judge-b"), ("reward", "judge-b")]
        assert verify(bank)["ok"]
        assert hygiene.undo(bank, source="judge-a")["undone"] == 0  # already undone
        # a later undo of the other source sees the re-applied copies: back to q_init
        assert hygiene.undo(bank, source="judge-*")["undone"] == 3
        assert [r[0] for r in bank.conn.execute("SELECT q FROM memories WHERE id IN (1, 2) ORDER BY id")] == [0.0, 0.0]
        assert verify(bank)["ok"]


def test_undo_by_time_window_and_superseded_rewards(bank_at: Callable[[str], str]) -> None:
    db = bank_at("t")
    make_bank(db, 2)
    with MemoryBank(db, create=False) as bank:
        bank.reward(1.0, memory_ids=[1, 2], source="a")
        bank.reward(-1.0, memory_ids=[1], source="b")
        bank.reward(1.0, memory_ids=[1], source="c")
        since = bank.conn.execute("SELECT created_at FROM rewards WHERE source = 'b'").fetchone()[0]
        until = bank.conn.execute("SELECT created_at FROM rewards WHERE source = 'c'").fetchone()[0]
        report = hygiene.undo(bank, since=since, until=until)  # only b's reward: [since, until)
        assert report["undone"] == 1 and report["reapplied"] == 1
        assert bank.conn.execute("SELECT q FROM memories WHERE id = 1").fetchone()[0] == \
            pytest.approx(q_update(q_update(0.0, 1.0, 0.3), 1.0, 0.3))
        hygiene.reset_q(bank, [2], reason="start over")
        q = bank.conn.execute("SELECT q FROM memories WHERE id = 1").fetchone()[0]
        # a's rewards precede memory 1's undo row and memory 2's reset: they no longer count
        report = hygiene.undo(bank, until=since.replace("+00:00", "Z"))
        assert report["superseded"] == 2 and report["undone"] == 0 and report["memories"] == []
        assert bank.conn.execute("SELECT q FROM memories WHERE id = 1").fetchone()[0] == q
        assert verify(bank)["ok"]
        for kwargs, message in [({}, "give --source, --since and/or --until"),
                                ({"since": "yesterday"}, "--since must be an ISO 8601 time")]:
            before = table_state(db)
            with pytest.raises(MemrlError, match=message):
                hygiene.undo(bank, **kwargs)
            assert table_state(db) == before


def test_reset_q_is_a_ledger_row_and_bad_ids_change_nothing(bank_at: Callable[[str], str]) -> None:
    db = bank_at("z")
    make_bank(db, 3)
    with MemoryBank(db, create=False) as bank:
        bank.reward(1.0, memory_ids=[1, 2])
        assert hygiene.reset_q(bank, [1], reason="bad run", actor="ops") == [{"id": 1, "q_before": 0.3,
                                                                              "q_after": 0.0}]
        assert ledger_sources(bank, 1)[-1] == ("set", "reset-q by ops: bad run")
        assert verify(bank)["ok"]
        for call in (lambda: hygiene.reset_q(bank, [2, 99]), lambda: hygiene.quarantine(bank, [3, 98, 99]),
                     lambda: hygiene.release(bank, [77]), lambda: hygiene.quarantine(bank, [])):
            before = (table_state(db), bank.conn.execute("SELECT count(*) FROM quarantine_log").fetchone()[0])
            with pytest.raises(MemrlError, match="unknown memory id|give one or more memory ids"):
                call()
            assert (table_state(db), bank.conn.execute("SELECT count(*) FROM quarantine_log").fetchone()[0]) == before


def test_quarantine_and_source_survive_export_import_and_merge(bank_at: Callable[[str], str]) -> None:
    first, second = bank_at("first"), bank_at("second")
    vectors = make_bank(first, 6)
    with MemoryBank(first, create=False) as bank:
        bank.reward(1.0, memory_ids=[1, 2], source="judge")
        hygiene.quarantine(bank, [1, 2], reason="suspicious", actor="ops")
        hygiene.release(bank, [2], reason="checked")
        out = io.StringIO()
        transfer.export_jsonl(bank, out, vectors=True)
    lines = [json.loads(line) for line in out.getvalue().splitlines()[1:]]
    assert [r["action"] for r in lines[0]["quarantine_log"]] == ["quarantine"]
    assert "quarantine_log" not in lines[2]  # none: the line stays readable by an older memrl
    with MemoryBank(bank_at("copy"), f"external:test:{DIM}") as copy:
        transfer.import_jsonl(copy, io.BytesIO(out.getvalue().encode()))
        assert copy.quarantined().tolist() == [1]
        assert [(r["action"], r["reason"], r["actor"]) for r in memory_view(copy, 2)["quarantine_log"]] == \
            [("quarantine", "suspicious", "ops"), ("release", "checked", hygiene.default_actor())]
        assert [m["source"] for m in sorted(top_q(copy, 10), key=lambda m: m["id"])] == SOURCES[:6]
        assert verify(copy)["ok"]
    # the second bank holds memory 1 and 3 too: 1 released there, 3 quarantined there
    with MemoryBank(second, f"external:test:{DIM}") as bank:
        bank.ingest_many([{"intent": f"task {i}", "experience": f"did {i}", "source": "other",
                           "vector": vectors[i].tolist()} for i in (0, 2)])
        hygiene.quarantine(bank, [1, 2])
        hygiene.release(bank, [1])
    merged = bank_at("merged")
    transfer.merge(first, second, merged)
    with MemoryBank(merged, create=False) as bank:
        assert bank.quarantined().tolist() == [1, 3]  # quarantined on either side stays quarantined
        assert [r["action"] for r in memory_view(bank, 1)["quarantine_log"]] == \
            ["quarantine", "quarantine", "release", "quarantine"]
        assert verify(bank)["ok"]
        found = phase_a_ids(merged, "auto", vectors[0], 6)
        assert 1 not in found and 3 not in found
        with bank.transaction() as conn:  # a state changed behind the log's back is caught
            conn.execute("UPDATE memories SET quarantined_at = NULL WHERE id = 1")
        assert verify(bank)["problems"] == ["1 memories have a quarantine state that differs from their quarantine log"]


def test_bad_quarantine_log_in_an_import_is_refused(bank_at: Callable[[str], str]) -> None:
    line = {"intent": "a", "experience": "b", "vector": [1.0] + [0.0] * (DIM - 1),
            "quarantine_log": [{"action": "delete", "created_at": "2026-01-01T00:00:00+00:00"}]}
    with MemoryBank(bank_at("bad"), f"external:test:{DIM}") as bank:
        with pytest.raises(MemrlError, match="line 1: quarantine_log must be a list"):
            transfer.import_jsonl(bank, io.BytesIO(json.dumps(line).encode()))
        assert bank.count() == 0


@pytest.mark.slow
def test_cli_quarantine_release_reset_undo(bank_at: Callable[[str], str]) -> None:
    db = bank_at("cli")
    vectors = make_bank(db, 4)
    query = json.dumps(vectors[0].tolist())
    memrl(db, "reward", "--memory", "1", "--memory", "2", "--reward", "1", "--source", "judge-x")
    assert as_json(memrl(db, "quarantine", "1", "3", "--reason", "spam", "--by", "ops", "--json")) == \
        {"changed": [1, 3], "unchanged": []}
    hit = as_json(memrl(db, "retrieve", "q", "--vector", query, "--threshold", "-1", "--k2", "4", "--json"))
    assert {m["id"] for m in hit["memories"]} == {2, 4}
    hit = as_json(memrl(db, "retrieve", "q", "--vector", query, "--threshold", "-1", "--source", "run:?",
                        "--source", "evil", "--json"))
    assert {m["id"] for m in hit["memories"]} == {2}
    shown = as_json(memrl(db, "inspect", "--memory", "1", "--json"))
    assert shown["quarantined_at"] and shown["quarantine_log"][0]["reason"] == "spam"
    assert as_json(memrl(db, "release", "1", "--json")) == {"changed": [1], "unchanged": []}
    preview = as_json(memrl(db, "undo", "--source", "judge-*", "--dry-run", "--json"))
    assert preview["dry_run"] and preview["undone"] == 2
    assert as_json(memrl(db, "undo", "--source", "judge-*", "--json"))["undone"] == 2
    assert as_json(memrl(db, "reset-q", "2", "--json"))["updated"] == [{"id": 2, "q_before": 0.0, "q_after": 0.0}]
    assert memrl(db, "inspect", "--verify").stdout.strip() == "ok"
    for args, message in [(["quarantine", "1", "99"], "unknown memory id 99; nothing was changed"),
                          (["reset-q", "7", "8"], "unknown memory ids 7, 8"),
                          (["quarantine", "one"], "Invalid value for 'ids'"),
                          (["undo", "--until", "soon"], "--until must be an ISO 8601 time")]:
        before = table_state(db)
        assert message in error_line(memrl(db, *args, ok=False))
        assert table_state(db) == before
