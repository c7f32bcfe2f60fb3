"""Phase A over a bank: the vector index a bank searches, and similarity recall through it.

The index is the bank's `index=` choice: an in-process matrix of the stored vectors (`numpy`, or
`bit`: sign-bit Hamming distance, then exact re-scoring; `memrl_cli.method.matrix_index`), or the engine's own
search (`Store.knn`: sqlite-vec, pgvector exact or HNSW). Quarantined memories are never found.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from memrl_cli.bank.connection import BankConnection
from memrl_cli.errors import MemrlError
from memrl_cli.method.retrieval import SEARCH_WIDTH, Filters, RetrieveParams, group_recall, phase_a
from memrl_cli.method.matrix_index import MatrixIndex
from memrl_cli.store.base import check_index_change

IN_PROCESS = ("numpy", "bit")  # the `index=` choices searched in this process rather than by the engine


class SearchIndex:
    """The search of one bank with `index=mode`; `warnings` is the bank's list (a one-time notice goes there)."""

    def __init__(self, db: BankConnection, mode: str, warnings: list[str]) -> None:
        self.db = db
        self.mode = mode
        self.warnings = warnings
        self.scan = MatrixIndex(bits=mode == "bit")
        self._scan_version: tuple[int, ...] | None = None

    def ensure(self, readonly: bool) -> None:
        """On opening a bank that has memories: build the engine index `index=` asks for if it lacks it."""
        if self.db.store.is_engine_index(self.mode) and not self.db.store.has_index(self.mode):
            if readonly:
                raise MemrlError(f"this bank has no {self.mode} index; open it writable to build one")
            self.set_index(self.mode)

    def first_write(self, dim: int) -> None:
        """Inside the bank's first write: an engine index asked for on a new bank indexes from the first memory on."""
        if self.db.store.is_engine_index(self.mode):
            self.db.store.build_index(self.mode, dim)

    def set_index(self, kind: str) -> dict[str, Any]:
        """Build (or rebuild) the engine's optional index, or drop it with `none` (`exact`); its description."""
        check_index_change(kind)
        with self.db.transaction():
            recorded = self.db.meta("embedder")
            self.db.store.change_index(kind, int(recorded["dim"]) if recorded else None)
        return self.db.store.index_info()

    def rebuild(self) -> int:
        """Rebuild the bank's sqlite-vec index from the stored vectors; the number indexed."""
        kind = self.db.store.rebuildable_index()
        if kind is None:
            raise MemrlError("this bank has no sqlite-vec index to rebuild (build one with `memrl doctor --index vec`)")
        self.set_index(kind)
        return self.db.count()

    def _load_matrix(self) -> MatrixIndex:
        """The in-process index, brought up to date if the bank changed (memories are append-only)."""
        version = self.db.version()
        if version == self._scan_version and not self.db.depth:
            return self.scan
        scan = self.scan
        if self.db.depth:  # inside a write: uncommitted rows may roll back, so search them without keeping them
            scan = MatrixIndex(bits=self.scan.bits)
            scan.extend(self.scan.ids, self.scan.matrix)
        rows = self.db.store.memories_after(scan.last_id)
        if rows:
            ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            scan.extend(ids, self.db.store.decode([r[1] for r in rows]))
        if not self.db.depth:
            self._scan_version = version
        return scan

    def search(self, vector: np.ndarray, k1: int, threshold: float, filters: Filters = (),
               recalled: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids, similarities) of the top-k1 memories at or above `threshold`, best first, among those
        retrieval may return: never a quarantined or forgotten memory, and with `filters` ((column,
        patterns) pairs: source, scope), only memories whose column matches one of its shell-style
        patterns (`Store.matches`), for each. `recalled`: see `MatrixIndex.search` (the bit index's
        shortlist when the search is wider than the recall)."""
        found = self._engine_search(vector, k1, threshold, filters, vectors=False)
        if found is not None:
            return phase_a(found[1], found[0], k1, threshold)
        return self._scan_search(vector, k1, threshold, filters, recalled)

    def _scan_search(self, vector: np.ndarray, k1: int, threshold: float, filters: Filters,
                     recalled: int | None) -> tuple[np.ndarray, np.ndarray]:
        """`search` in this process, over the in-process index (`MatrixIndex`)."""
        db = self.db
        if self.mode == "auto" and "numpy-scan" not in self.warnings:
            problem = db.store.unusable_index()
            if problem is not None:
                self.warnings.append("numpy-scan")
                print(f"memrl: warning: {problem}", file=sys.stderr)
        scan = self._load_matrix()
        mask = None
        hidden = self.hidden()
        conditions, args = db.store.filter_condition(filters)
        if len(hidden) or conditions:
            mask = ~np.isin(scan.ids, hidden)
            if conditions:
                mask &= np.isin(scan.ids, db.store.ids_where(conditions, args))
        return scan.search(vector, k1, threshold, mask, recalled)

    def _engine_search(self, vector: np.ndarray, k: int, threshold: float, filters: Filters,
                       vectors: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
        """`Store.knn` of the k nearest at or above `threshold` (with their stored vectors if asked),
        when the engine searches this bank; None when it is searched in this process."""
        db, mode = self.db, self.mode
        if mode in IN_PROCESS or (mode == "auto" and not db.cached("index_ready", db.store.index_ready)):
            return None
        if mode == "auto":  # the engine index the bank records (cached)
            mode = db.cached("index_kind", lambda: db.store.index_info()["kind"])
        return db.store.knn(vector, k, mode, self.hidden(), filters, threshold, vectors)

    def quarantined(self) -> np.ndarray:
        """Ids of the quarantined memories, ascending (see `memrl_cli.ops.hygiene`)."""
        return self.db.cached("quarantined", lambda: np.array(self.db.store.quarantined_ids(), dtype=np.int64))

    def hidden(self) -> np.ndarray:
        """Ids of the memories no retrieval returns, ascending: the quarantined and the forgotten ones."""
        return self.db.cached("hidden", lambda: np.array(self.db.store.hidden_ids(), dtype=np.int64))

    def recall(self, vector: np.ndarray, params: RetrieveParams) -> tuple[list[int], list[float]]:
        """Phase A: (ids, similarities) of the candidates, best first (grouped with `recall="groups"`)."""
        if params.recall == "memories":
            ids, sims = self.search(vector, params.k1, params.threshold, params.filters)
            return ids.tolist(), sims.tolist()
        width = min(4096, max(params.k1, params.pool) * SEARCH_WIDTH)
        found = self._engine_search(vector, width, params.threshold, params.filters, vectors=True)
        if found is not None:  # the vectors came with the search (group_recall sorts the rows itself)
            ids, sims, stored = found
        else:
            ids, sims = self._scan_search(vector, width, params.threshold, params.filters, params.k1)
            stored = None
        if not len(ids):
            return [], []
        vectors = self.stored_vectors(ids) if stored is None else stored
        return group_recall(ids, sims, vectors, params.k1, params.group_threshold, params.pool,
                            params.member_similarity)

    def stored_vectors(self, ids: np.ndarray) -> np.ndarray:
        """The stored vectors of `ids`, in order: rows of the in-process index when it holds them all
        (stored vectors never change), else one read (inside a write, rows not yet committed)."""
        held = self.scan.ids
        rows = np.minimum(np.searchsorted(held, ids), max(len(held) - 1, 0))
        if len(held) and np.array_equal(held[rows], ids):
            return self.scan.matrix[rows]
        found = {r[0]: r[1] for r in self.db.by_ids("id, embedding", "memories", ids.tolist())}
        return self.db.store.decode([found[i] for i in ids.tolist()]).astype(np.float32)
