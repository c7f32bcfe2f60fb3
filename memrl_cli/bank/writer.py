"""Writing new memories into a bank: all of a batch or none, exact duplicates kept once.

A write that adds memories records the bank's embedder on its first write (`BankVectors`), checks
the vectors' dimension, inserts the rows (`Store.insert_memories`), then indexes them in the
engine and refreshes the similarity statistics when the bank has grown (`Calibration`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from memrl_cli.bank.calibration import Calibration
from memrl_cli.bank.connection import BankConnection
from memrl_cli.errors import MemrlError
from memrl_cli.bank.search_index import SearchIndex
from memrl_cli.bank.records import MEMORY_COLUMNS, IngestResult, MemoryInput, Progress, content_hash, memory_row, now
from memrl_cli.bank.vectors import BankVectors
from memrl_cli.method.learning import REWARD_RANGE, number


class MemoryWriter:
    """Adds memories to one bank: `ingest_many`, or `begin` … `insert` … `end` inside a caller's write."""

    def __init__(self, db: BankConnection, vectors: BankVectors, index: SearchIndex, calibration: Calibration,
                 reward_range: Callable[[], tuple[float, float]] = lambda: REWARD_RANGE) -> None:
        self.db = db
        self.vectors = vectors
        self.index = index
        self.calibration = calibration
        self.reward_range = reward_range  # an initial Q must lie in it: Q moves toward the rewards
        self._inserted: list[tuple[int, Any]] = []  # (id, encoded vector) of the write's new memories

    def ingest_many(self, records: Iterable[MemoryInput | dict[str, Any]],
                    progress: Progress | None = None) -> list[IngestResult]:
        """Store many memories atomically: all of them, or (on any error) none."""
        items = [r if isinstance(r, MemoryInput) else MemoryInput.parse(r, f"record {i + 1}: ")
                 for i, r in enumerate(records)]
        if not items:
            return []
        low, high = self.reward_range()
        for i, item in enumerate(items):
            if item.q != 0 and not low <= item.q <= high:  # (the default 0 starts anywhere, as in the paper)
                where = f"record {i + 1}: " if len(items) > 1 else ""
                raise MemrlError(f"{where}q {number(item.q)} is outside the bank's reward range [{number(low)}, "
                                 f"{number(high)}]: Q moves toward the rewards, so it starts among them (`memrl "
                                 "config reward_range` widens the range)")
        vectors = self.vectors.vectors_for([m.intent for m in items], [m.vector for m in items], progress)
        stamp = now()
        results: list[IngestResult] = []
        encode = self.db.store.encode
        with self.db.transaction():
            self.begin(vectors)
            rows = [memory_row(item, encode(vector), stamp) for item, vector in zip(items, vectors)]
            for item, row, new_id in zip(items, rows, self.db.store.insert_memories(MEMORY_COLUMNS, rows)):
                if new_id is None:
                    existing = self.db.store.id_with_content(content_hash(item.intent, item.experience, item.scope,
                                                                          item.metadata))
                    assert existing is not None  # the insert was skipped for this content
                    results.append(IngestResult(existing, False))
                else:
                    self._inserted.append((new_id, row[-1]))
                    results.append(IngestResult(new_id, True))
            self.end()
        return results

    def begin(self, vectors: np.ndarray) -> None:
        """Inside a write: record the embedder (on the bank's first write) and check the vectors' dimension."""
        dim, first = self.vectors.record_embedder()
        if first:
            self.index.first_write(dim)
        if len(vectors) and vectors.shape[1] != dim:
            raise MemrlError(f"vectors have dimension {vectors.shape[1]}, this bank's is {dim}")
        self._inserted = []

    def insert(self, item: MemoryInput, vector: np.ndarray, stamp: str, stored: dict[str, Any] | None = None) -> int | None:
        """Inside a write, after `begin`: insert one memory; None if its content is already stored.

        `stored` carries an imported memory's state: q_init, visits and timestamps.
        """
        row = self.row(item, vector, stamp, stored)
        new_id = self.db.store.insert_memories(MEMORY_COLUMNS, [row])[0]
        if new_id is not None:
            self._inserted.append((new_id, row[-1]))
        return new_id

    def row(self, item: MemoryInput, vector: np.ndarray, stamp: str, stored: dict[str, Any] | None = None) -> tuple[Any, ...]:
        """A memory's values in `MEMORY_COLUMNS` order, its vector encoded for the store."""
        return memory_row(item, self.db.store.encode(vector), stamp, stored)

    def end(self) -> None:
        """Inside a write that added memories: index them in the engine; refresh calibration."""
        self.db.store.add_to_index(self._inserted)
        self.calibration.recalibrate(force=False)
