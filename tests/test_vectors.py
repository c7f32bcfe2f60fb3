"""memrl_cli.bank.vectors alone: the embedder recorded on the first write, given vectors checked, and the
query cache that lets a repeated query skip the (real, local) model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from bank_parts import connect

from memrl_cli.errors import MemrlError
from memrl_cli.bank.records import now
from memrl_cli.bank.vectors import BankVectors


def test_the_first_write_records_the_embedder_and_later_ones_check_against_it(tmp_path: Path) -> None:
    db = connect(str(tmp_path / "b.db"))
    vectors = BankVectors(db, "external:test:3")
    assert vectors.dim() is None
    with db.transaction():
        assert vectors.record_embedder() == (3, True)
        assert vectors.record_embedder() == (3, False)
    assert vectors.dim() == 3 and db.meta("embedder")["spec"] == "external:test:3"
    out = vectors.vectors_for(["a", "b"], [[3, 0, 4], [0, 2, 0]], None)
    assert out.dtype == np.float32 and np.allclose(out, [[0.6, 0, 0.8], [0, 1, 0]])
    with pytest.raises(MemrlError, match="vector has dimension 2, the bank's embedder gives 3"):
        vectors.vectors_for(["a"], [[1, 0]], None)
    with pytest.raises(MemrlError, match="vector has dimension 4, the bank's embedder gives 3"):
        vectors.query_vector("q", [1, 0, 0, 0])
    assert np.allclose(vectors.query_vector("q", [0, 0, 2]), [0, 0, 1])
    with pytest.raises(MemrlError, match="external"):  # an external embedder embeds nothing itself
        vectors.vectors_for(["a"], [None], None)
    other = BankVectors(db, "local")
    with pytest.raises(MemrlError):  # not the embedder the bank recorded
        other.embedder


def test_a_cached_query_skips_the_model(tmp_path: Path) -> None:
    db = connect(str(tmp_path / "b.db"))
    vectors = BankVectors(db)  # a new bank: the local model
    with db.transaction():
        vectors.record_embedder()
    vector, key = vectors.embed_query("warm up an apple")
    assert key is not None and vector.shape == (384,)
    with db.transaction():
        vectors.cache_query(key, vector, now())
    progress: list[int] = []
    cached, again = BankVectors(db).embed_query("warm up an apple")
    assert again is None and np.array_equal(cached, vector)
    embedded = vectors.vectors_for(["a", "b", "c"], [None, [1.0] * 384, None], progress.append)
    assert progress == [2] and np.allclose(np.linalg.norm(embedded, axis=1), 1)
