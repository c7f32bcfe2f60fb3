"""memrl_cli.bank.search_index alone, on both engines: Phase-A search (in process and by the engine), quarantine
and source filters, the matrix kept current, the engine's optional index; and the Store's answers
about `index=` choices that the bank asks instead of knowing the engines itself."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from bank_parts import connect, seed, unit

from memrl_cli.errors import MemrlError
from memrl_cli.bank.search_index import SearchIndex
from memrl_cli.bank.embedders import normalise
from memrl_cli.method.retrieval import SEARCH_WIDTH, RetrieveParams, group_recall
from memrl_cli.store import INDEX_NAMES, check_index_change


def exact(vectors: np.ndarray, query: np.ndarray, k: int) -> list[int]:
    return (np.argsort(-(vectors @ query), kind="stable")[:k] + 1).tolist()


def test_search_finds_the_nearest_never_the_quarantined_and_filters_sources(bank_at: Callable[[str], str]) -> None:
    db = connect(bank_at("b"))
    vectors = unit(40, dim=8)
    seed(db, vectors[:30], source="agent-a")
    seed(db, vectors[30:], source="agent-b")
    modes = [m for m in db.store.indexes if m not in ("vec", "hnsw")]  # the engine index has its own test
    for mode in modes:
        index = SearchIndex(db, mode, [])
        ids, sims = index.search(vectors[3], 5, -1.0)
        assert ids.tolist() == exact(vectors, vectors[3], 5) and sims[0] == pytest.approx(1.0, abs=1e-5)
        assert index.search(vectors[3], 5, 1.01)[0].tolist() == []  # nothing at or above the threshold
        with db.transaction() as conn:
            conn.execute("UPDATE memories SET quarantined_at = 'now' WHERE id = 4")
        assert 4 not in index.search(vectors[3], 40, -1.0)[0].tolist() and index.quarantined().tolist() == [4]
        with db.transaction() as conn:
            conn.execute("UPDATE memories SET quarantined_at = NULL WHERE id = 4")
        assert set(index.search(vectors[3], 40, -1.0, (("source", ("*-b",)),))[0].tolist()) == set(range(31, 41))
        with db.transaction() as conn:  # forgotten (`memrl forget`): hidden like the quarantined
            conn.execute("UPDATE memories SET forgotten_at = 'now' WHERE id = 4")
        assert 4 not in index.search(vectors[3], 40, -1.0)[0].tolist() and index.hidden().tolist() == [4]
        assert index.quarantined().tolist() == []
        with db.transaction() as conn:
            conn.execute("UPDATE memories SET forgotten_at = NULL WHERE id = 4")


def test_the_in_process_matrix_follows_other_writers_and_uncommitted_rows(bank_at: Callable[[str], str]) -> None:
    location = bank_at("b")
    db, other = connect(location), connect(location)
    vectors = unit(12, dim=8)
    seed(db, vectors[:10])
    mode = "numpy" if "numpy" in db.store.indexes else "auto"
    index = SearchIndex(db, mode, [])
    assert index.search(vectors[10], 1, -1.0)[0].tolist() != [11]
    seed(other, vectors[10:11])  # another connection's commit
    assert index.search(vectors[10], 1, -1.0)[0].tolist() == [11]
    with pytest.raises(ZeroDivisionError):
        with db.transaction():
            seed(db, vectors[11:])  # nested: a savepoint of this write
            assert index.search(vectors[11], 1, -1.0)[0].tolist() == [12]  # this write's own row
            1 / 0
    assert index.search(vectors[11], 1, -1.0)[0].tolist() != [12]  # rolled back, and not kept
    params = RetrieveParams(k1=2, threshold=-1.0, recall="memories")
    assert index.recall(vectors[0], params)[0] == exact(vectors[:11], vectors[0], 2)


def test_the_engine_index_is_built_used_and_dropped(bank_at: Callable[[str], str]) -> None:
    db = connect(bank_at("b"))
    store = db.store
    kind = next(m for m in store.indexes if store.is_engine_index(m))
    if store.index_problem(kind):
        pytest.skip(store.index_problem(kind))
    index = SearchIndex(db, kind, [])
    with pytest.raises(MemrlError, match="the bank is empty"):
        index.set_index(kind)
    vectors = unit(30, dim=8)
    seed(db, vectors)
    assert not store.has_index(kind) and store.rebuildable_index() is None
    index.ensure(readonly=False)  # opening with index=KIND builds it
    assert store.has_index(kind) and store.index_info()["kind"] == kind
    assert index.search(vectors[5], 3, -1.0)[0].tolist() == exact(vectors, vectors[5], 3)
    if store.rebuildable_index():
        assert index.rebuild() == 30
    assert index.set_index("none" if kind == "vec" else "exact")["kind"] in ("none", "exact")
    assert not store.has_index(kind)
    with pytest.raises(MemrlError, match="no sqlite-vec index to rebuild"):
        index.rebuild()


def recall_in_two_reads(index: SearchIndex, vector: np.ndarray, params: RetrieveParams) -> tuple[list[int], list[float]]:
    """Grouped recall as it was before issue 17: the search, then a second read of the vectors."""
    ids, sims = index.search(vector, max(params.k1, params.pool) * SEARCH_WIDTH, params.threshold, params.filters,
                             recalled=params.k1)
    if not len(ids):
        return [], []
    stored = {r[0]: r[1] for r in index.db.by_ids("id, embedding", "memories", ids.tolist())}
    vectors = index.db.store.decode([stored[i] for i in ids.tolist()])
    return group_recall(ids, sims, vectors, params.k1, params.group_threshold, params.pool)


def test_grouped_recall_reads_the_vectors_with_the_engine_search_and_recalls_the_same(
        bank_at: Callable[[str], str]) -> None:
    """The engine's search returns the stored vectors of the rows at or above the threshold in the
    same query: grouped recall is unchanged (ids, similarities, order) against two reads and against
    the in-process scan, with filters, duplicates, and searches wider than HNSW's ef_search."""
    db = connect(bank_at("b"))
    store = db.store
    rng = np.random.default_rng(3)
    centres = unit(12, dim=16, seed=3)
    vectors = normalise(centres[rng.integers(0, 12, 500)] + 0.25 * rng.normal(size=(500, 16))).astype(np.float32)
    vectors[21:25] = vectors[20]  # identical vectors: one group
    seed(db, vectors[:250], source="agent-a")
    seed(db, vectors[250:], source="agent-b")
    with db.transaction() as conn:
        conn.execute("UPDATE memories SET quarantined_at = 'now' WHERE id IN (7, 22, 301)")
    queries = normalise(vectors[[20, 5, 260, 499]] + 0.1 * rng.normal(size=(4, 16)))
    cases = [RetrieveParams(threshold=-1.0, recall="groups"), RetrieveParams(threshold=0.6, sources=("*-b",), recall="groups"),
             RetrieveParams(k1=3, pool=100, threshold=0.2, group_threshold=0.8, recall="groups")]  # 400 rows searched
    numpy = SearchIndex(db, "numpy", [])
    kind = next(m for m in store.indexes if store.is_engine_index(m))
    modes = ["exact"] if kind == "hnsw" else []
    if not store.index_problem(kind):
        modes.append(kind)
    for mode in modes:
        index = SearchIndex(db, mode, [])
        index.ensure(readonly=False)
        if mode == "hnsw":  # a 500-row table is cheaper to scan: make the planner use the index
            store.conn.execute("SET enable_seqscan = off")
            assert len(store.knn(queries[0], 400, mode)[0]) == 400  # more than ef_search (200): a list of 400
        for params in cases:
            for query in queries:
                got = index.recall(query, params)
                assert got == recall_in_two_reads(index, query, params), (mode, params)
                if mode != "hnsw":  # exact search: what the in-process scan recalls
                    want = numpy.recall(query, params)
                    assert got[0] == want[0] and got[1] == pytest.approx(want[1], abs=1e-6), (mode, params)
                    assert not set(got[0]) & {7, 22, 301} and min(got[1], default=1.0) >= params.threshold
        if mode == "hnsw":  # the wider list was set for that query alone, also inside a transaction
            assert store.conn.execute("SHOW hnsw.ef_search").fetchone()[0] == "200"
            with db.transaction():
                index.recall(queries[0], cases[2])
                assert store.conn.execute("SHOW hnsw.ef_search").fetchone()[0] == "200"


def test_the_store_answers_for_its_engine(bank_at: Callable[[str], str]) -> None:
    store = connect(bank_at("b")).store
    assert set(INDEX_NAMES) == {"auto", "numpy", "bit", "vec", "exact", "hnsw"}
    assert all(store.index_problem(mode) is None for mode in store.indexes if mode != "vec" or store.vec.loaded)
    other = next(m for m in INDEX_NAMES if m not in store.indexes)
    assert store.index_problem(other) == (f"index={other} is not available for a {store.kind} bank; "
                                          f"use one of {', '.join(store.indexes)}")
    assert [m for m in INDEX_NAMES if store.is_engine_index(m)] == (["vec"] if "vec" in store.indexes else ["hnsw"])
    assert store.unusable_index() is None
    check_index_change("none")
    with pytest.raises(MemrlError, match="index must be vec or none"):
        check_index_change("numpy")
