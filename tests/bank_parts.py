"""Helpers of the unit tests of MemoryBank's parts (tests/test_records.py … test_ledger.py): each part
is built over a real Store and `BankConnection`, without a `MemoryBank`."""

from __future__ import annotations

import numpy as np

from memrl_cli.bank.connection import BankConnection
from memrl_cli.bank.records import MEMORY_COLUMNS, MemoryInput, memory_row, now
from memrl_cli.store import open_store
from memrl_cli.bank.vectors import BankVectors


def connect(location: str, readonly: bool = False) -> BankConnection:
    """A connection to the bank at `location` (made if missing, unless read-only)."""
    return BankConnection(open_store(location, readonly=readonly), readonly)


def unit(n: int, dim: int = 4, seed: int = 0) -> np.ndarray:
    """`n` random unit float32 vectors."""
    v = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def seed(db: BankConnection, vectors: np.ndarray, source: str | None = None) -> list[int]:
    """Store one memory per vector (`task i`) straight through the Store, embedder `external:test:DIM`; the ids."""
    with db.transaction():
        BankVectors(db, f"external:test:{vectors.shape[1]}").record_embedder()
        start = db.count()
        rows = [memory_row(MemoryInput(f"task {start + i}", f"did {start + i}", source=source), db.store.encode(v), now())
                for i, v in enumerate(vectors)]
        ids = [int(i) for i in db.store.insert_memories(MEMORY_COLUMNS, rows) if i is not None]
        db.store.add_to_index([(i, row[-1]) for i, row in zip(ids, rows)])
    return ids
