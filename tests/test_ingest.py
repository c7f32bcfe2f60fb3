"""memrl_cli.bank.writer alone, on both engines: all of a batch or none, duplicates kept once, imported
state kept, and the engine index and calibration kept up by every write that adds memories."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from bank_parts import connect, unit

from memrl_cli.bank.calibration import Calibration
from memrl_cli.errors import MemrlError
from memrl_cli.bank.search_index import SearchIndex
from memrl_cli.bank.writer import MemoryWriter
from memrl_cli.bank.records import IngestResult, MemoryInput, now
from memrl_cli.bank.vectors import BankVectors


def writer_at(location: str, mode: str = "auto") -> MemoryWriter:
    db = connect(location)
    return MemoryWriter(db, BankVectors(db, "external:test:4"), SearchIndex(db, mode, []), Calibration(db))


def test_a_batch_is_stored_whole_with_duplicates_once(bank_at: Callable[[str], str]) -> None:
    writer = writer_at(bank_at("b"))
    v = unit(3).tolist()
    results = writer.ingest_many([{"intent": "a", "experience": "x", "vector": v[0]},
                                  MemoryInput("b", "y", vector=v[1]), {"intent": "a", "experience": "x", "vector": v[2]}])
    assert results == [IngestResult(1, True), IngestResult(2, True), IngestResult(1, False)]
    assert writer.ingest_many([]) == []
    with pytest.raises(MemrlError, match="record 2: outcome must be one of"):
        writer.ingest_many([{"intent": "c", "experience": "z", "vector": v[0]},
                            {"intent": "d", "experience": "z", "outcome": "?", "vector": v[0]}])
    with pytest.raises(MemrlError, match="vector has dimension 3"):
        writer.ingest_many([{"intent": "c", "experience": "z", "vector": v[0]},
                            {"intent": "d", "experience": "z", "vector": [1, 0, 0]}])
    assert writer.db.count() == 2  # the refused batches wrote nothing
    assert writer.db.meta("sim_stats")["memories"] == 2  # the first write calibrated


def test_begin_insert_end_inside_a_callers_write(bank_at: Callable[[str], str]) -> None:
    writer = writer_at(bank_at("b"))
    vectors = unit(2)
    stamp = now()
    with writer.db.transaction():
        writer.begin(vectors)
        first = writer.insert(MemoryInput("a", "x", q=0.5), vectors[0], stamp,
                              {"q_init": 0.1, "visits": 4, "created_at": "2020-01-01T00:00:00"})
        assert writer.insert(MemoryInput("a", "x"), vectors[1], stamp) is None
        writer.end()
    row = writer.db.conn.execute("SELECT q, q_init, visits, created_at FROM memories WHERE id = ?", (first,)).fetchone()
    assert tuple(row) == (0.5, 0.1, 4, "2020-01-01T00:00:00")
    with pytest.raises(MemrlError, match="vectors have dimension 3, this bank's is 4"):
        with writer.db.transaction():
            writer.begin(unit(1, dim=3))


def test_the_engine_index_asked_for_indexes_from_the_first_memory(bank_at: Callable[[str], str]) -> None:
    location = bank_at("b")
    store = connect(location).store
    kind = next(m for m in store.indexes if store.is_engine_index(m))
    if store.index_problem(kind):
        pytest.skip(store.index_problem(kind))
    writer = writer_at(location, kind)
    writer.ingest_many([{"intent": f"t{i}", "experience": "x", "vector": v} for i, v in enumerate(unit(5).tolist())])
    assert writer.db.store.has_index(kind)
    if kind == "vec":
        assert writer.db.conn.execute("SELECT count(*) FROM memory_index").fetchone()[0] == 5


class CountingEmbedder:
    """A deterministic embedder (one unit vector per text, from its hash) that counts the texts it embeds."""

    spec = "counting"
    dim = 8

    def __init__(self) -> None:
        self.texts: list[str] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.texts += texts
        rows = [np.random.default_rng(abs(hash(t)) % 2**32).normal(size=self.dim) for t in texts]
        return np.array([r / np.linalg.norm(r) for r in rows], dtype=np.float32)


def test_each_distinct_intent_is_embedded_once_per_call(bank_at: Callable[[str], str]) -> None:
    db = connect(bank_at("b"))
    vectors = BankVectors(db, "counting")
    embedder = CountingEmbedder()
    vectors._embedder = embedder
    writer = MemoryWriter(db, vectors, SearchIndex(db, "auto", []), Calibration(db))
    records = [{"intent": f"task {i % 7}", "experience": f"attempt {i}"} for i in range(300)]  # 7 intents, 300 memories
    seen: list[int] = []
    results = writer.ingest_many(records, seen.append)
    assert sum(r.created for r in results) == 300
    asked = [t for t in embedder.texts if t.startswith("task ")]  # the rest: the fingerprint's probe
    assert sorted(asked) == [f"task {i}" for i in range(7)]
    assert sum(seen) == 300  # progress counts memories, not embedder calls
    rows = dict(db.conn.execute("SELECT id, embedding FROM memories").fetchall())
    first, same_intent = db.store.decode([rows[results[0].id], rows[results[7].id]])
    assert np.allclose(first, embedder.embed(["task 0"])[0], atol=1e-6)  # the embedder's vector of that text
    assert np.array_equal(first, same_intent)  # memories of one intent share it
