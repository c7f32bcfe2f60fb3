"""`MemoryBank`: the whole truth of an agent's episodic memory, in one SQLite file (or a PostgreSQL database).

A memory is an (intent embedding, experience text, utility Q) triplet plus bookkeeping.
The bank holds the memories with their float32 vectors, a receipt for every retrieval, an
append-only reward ledger of which Q is a replay, and meta (embedder fingerprint,
similarity statistics); optionally an engine index over the vectors (sqlite-vec, HNSW).

Every write is one transaction, so parallel processes never lose an update, and a crash
leaves the bank at the last commit. `MemoryBank` is the facade over parts usable alone (the
map: docs/architecture.md): the engine (`store`), `connection`, `vectors`, `records`, `index`,
`calibration`, `ingest`, `receipts`, `ledger`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import numpy as np

from memrl_cli.bank.calibration import Calibration
from memrl_cli.bank.connection import BankConnection
from memrl_cli.bank.embedders import Embedder
from memrl_cli.errors import MemrlError
from memrl_cli.bank.search_index import SearchIndex
from memrl_cli.bank.writer import MemoryWriter
from memrl_cli.method.learning import DEFAULT_ALPHA
from memrl_cli.bank.ledger import Ledger
from memrl_cli.bank.retriever import Retrieval, Retriever
from memrl_cli.bank.records import IngestResult, MemoryInput, Progress
from memrl_cli.method.retrieval import RetrieveParams
from memrl_cli.store.base import INDEX_NAMES, Store, is_server_url, open_store
from memrl_cli.bank.vectors import BankVectors

# Names other modules import from here (the facade), though they live in the parts.
__all__ = ["MemoryBank", "IngestResult", "MemoryInput", "Progress", "Retrieval"]


class MemoryBank:
    """The memory bank. Open one per process (or per thread); it is cheap.

    `location` is a SQLite file path, or a `postgresql://` URL (see `memrl_cli.store.postgres`).
    `embedder` is an embedder spec (see `memrl_cli.bank.embedders`); by default the one the bank
    was made with, or `local` for a new bank. `index` chooses Phase-A search:

    - SQLite: `auto` (the bank's sqlite-vec index if it has one, else `numpy`), `numpy` (an
      in-process matrix, fastest for long-lived processes), `bit` (that matrix searched by
      sign-bit Hamming distance, then exact float re-scoring of a shortlist: approximate,
      fastest at large sizes; see `memrl_cli.method.matrix_index`), or `vec` (sqlite-vec's KNN; builds the
      bank's sqlite-vec index if it has none: a second copy of every vector).
    - PostgreSQL: `auto` (the bank's HNSW index if it has one, else exact), `exact`
      (pgvector scan), or `hnsw` (pgvector HNSW, approximate; built if missing).

    `busy_timeout` is how many seconds a statement waits for another writer's lock before failing with
    `BankBusyError` (default: 30 s on SQLite; the server's `lock_timeout` on PostgreSQL).

    Values read on every retrieve are cached until the bank changes (`memrl_cli.bank.connection`).
    """

    def __init__(self, path: str | os.PathLike[str], embedder: str | None = None, *, index: str = "auto",
                 readonly: bool = False, create: bool = True, busy_timeout: float | None = None) -> None:
        location = os.fspath(path)
        if index not in INDEX_NAMES:
            raise MemrlError(f"index must be one of {', '.join(INDEX_NAMES)}, got {index!r}")
        self.readonly = readonly
        self.store: Store = open_store(location, readonly=readonly, create=create, busy_timeout=busy_timeout)
        self.path = self.store.location
        self.conn = self.store.conn
        self.warnings: list[str] = list(self.store.warnings)
        try:
            problem = self.store.index_problem(index)
            if problem:
                raise MemrlError(problem)
            self._db = BankConnection(self.store, readonly)
            self._cache = self._db.cache  # the values cached until the bank changes
            self._vectors = BankVectors(self._db, embedder)
            self._index = SearchIndex(self._db, index, self.warnings)
            self._calibration = Calibration(self._db)
            self._ledger = Ledger(self._db)
            self._writer = MemoryWriter(self._db, self._vectors, self._index, self._calibration,
                                        self._ledger.reward_range)
            self._retriever = Retriever(self._db, self._vectors, self._index, self._calibration)
            recorded = self.meta("embedder")
            if recorded and embedder and recorded["spec"] != embedder:
                raise MemrlError(f"this bank was made with embedder {recorded['spec']!r}, not {embedder!r}; "
                                 "omit --embedder to use the bank's own, or re-import into a new bank")
            if recorded:
                self._index.ensure(readonly)
        except BaseException:
            self.close()
            raise

    @property
    def vec(self) -> Any:
        """sqlite-vec's status on a SQLite bank (`loaded`, `reason`)."""
        return getattr(self.store, "vec", None)

    @property
    def is_server(self) -> bool:
        """Whether the bank lives on a PostgreSQL server."""
        return is_server_url(self.store.location)

    # -- plumbing ---------------------------------------------------------------

    def close(self) -> None:
        """Close the connection."""
        self.store.close()

    def __enter__(self) -> MemoryBank:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def transaction(self) -> AbstractContextManager[Any]:
        """One atomic write, rolled back on any error (`as`: the connection); nested ones are savepoints
        (see `BankConnection.transaction`)."""
        return self._db.transaction()

    def snapshot(self) -> AbstractContextManager[None]:
        """Reads that all see the bank at one moment while others write; inside a write, its own view."""
        return self._db.snapshot()

    def meta(self, key: str) -> Any:
        """A value from the meta table (JSON-decoded), or None."""
        return self.store.meta(key)

    def count(self) -> int:
        """Number of memories."""
        return self._db.count()

    # -- embedder ---------------------------------------------------------------

    @property
    def embedder(self) -> Embedder:
        """The bank's embedder, built and checked against the bank's fingerprint on first use."""
        return self._vectors.embedder

    @property
    def dim(self) -> int | None:
        """The vector dimension, once the bank has an embedder recorded."""
        return self._vectors.dim()

    def query_vector(self, query: str, vector: list[float] | None = None) -> np.ndarray:
        """The unit vector of a query: the given one (checked), else the embedder's."""
        return self._vectors.query_vector(query, vector)

    # -- the vector index ---------------------------------------------------------

    def set_index(self, kind: str) -> dict[str, Any]:
        """Build (or rebuild) the engine's optional index, or drop it with `none`; return its description.

        SQLite: `vec` keeps a sqlite-vec copy of every vector (faster one-shot retrieval on large
        banks, twice the file size). PostgreSQL: `hnsw` (approximate; `exact` drops it).
        """
        return self._index.set_index(kind)

    def rebuild_index(self) -> int:
        """Rebuild the SQLite bank's sqlite-vec index from the stored vectors; return the number indexed."""
        return self._index.rebuild()

    def search(self, vector: np.ndarray, k1: int, threshold: float,
               sources: Sequence[str] = (), scopes: Sequence[str] = ()) -> tuple[np.ndarray, np.ndarray]:
        """Phase A: (ids, similarities) of the top-k1 memories at or above `threshold`, best first,
        among those retrieval may return: never a quarantined or forgotten memory, and with `sources`
        (`scopes`), only memories whose source (scope) matches one of these shell-style patterns
        (`Store.matches`)."""
        return self._index.search(vector, k1, threshold, RetrieveParams(sources=tuple(sources),
                                                                        scopes=tuple(scopes)).filters)

    def quarantined(self) -> np.ndarray:
        """Ids of the quarantined memories, ascending (see `memrl_cli.ops.hygiene`)."""
        return self._index.quarantined()

    def recall(self, vector: np.ndarray, params: RetrieveParams) -> tuple[list[int], list[float]]:
        """Phase A: (ids, similarities) of the candidates, best first (grouped with `recall="groups"`)."""
        return self._index.recall(vector, params)

    # -- similarity statistics for z(sim) (`sim_stats="bank"`) ------------------------

    def similarity_stats(self) -> tuple[float, float]:
        """(mean, std) used for z(sim): a user override, else the bank's own statistics."""
        return self._calibration.similarity_stats()

    def calibrate(self, mean: float | None = None, std: float | None = None, clear: bool = False) -> dict[str, Any]:
        """Recompute the bank's similarity statistics now, or set/clear a fixed override."""
        return self._calibration.calibrate(mean, std, clear)

    def ingest(self, intent: str, experience: str, outcome: str = "unknown", *, task_id: str | None = None,
               source: str | None = None, q: float = 0.0, metadata: dict[str, Any] | None = None,
               vector: list[float] | None = None, scope: str | None = None) -> IngestResult:
        """Store one memory; an exact duplicate (same intent, experience and scope) returns the existing id.
        `scope` (e.g. `user:alice`) is whom it belongs to: `RetrieveParams(scopes=...)` filters on it."""
        record = MemoryInput.parse({"intent": intent, "experience": experience, "outcome": outcome,
                                    "task_id": task_id, "source": source, "q": q, "metadata": metadata,
                                    "vector": vector, "scope": scope})
        return self._writer.ingest_many([record])[0]

    def ingest_many(self, records: Iterable[MemoryInput | dict[str, Any]], progress: Progress | None = None) -> list[IngestResult]:
        """Store many memories atomically: all of them, or (on any error) none."""
        return self._writer.ingest_many(records, progress)

    def vectors_for(self, texts: list[str], given: list[list[float] | None], progress: Progress | None = None) -> np.ndarray:
        """Unit vectors for memories to import: the given ones (checked), the rest embedded."""
        return self._vectors.vectors_for(texts, given, progress)

    @contextmanager
    def importing(self, vectors: np.ndarray) -> Iterator[Callable[..., int | None]]:
        """Inside a write: the import API (`memrl_cli.ops.transfer`). Yields `insert(item, vector, stamp, stored)`,
        which stores a memory with its stored state (q_init, visits, times) and returns its id, or None when
        its content is already stored; the new memories are indexed and calibration refreshed at the end."""
        self._writer.begin(vectors)
        yield self._writer.insert
        self._writer.end()

    # -- retrieve -----------------------------------------------------------------

    def retrieve(self, query: str, params: RetrieveParams | None = None, *, vector: list[float] | None = None,
                 record: bool = True, task_id: str | None = None, scope: str | None = None) -> Retrieval:
        """Both phases; with `record`, the receipt is stored and its id returned for `reward`. The receipt keeps
        `task_id` (the caller's id for the task: `reward(task=...)` finds it) and `scope` (whom the task belongs
        to); neither filters what is retrieved (`params.scopes` does)."""
        return self._retriever.retrieve(query, params, vector, record, task_id, scope)

    def record(self, retrieval: Retrieval) -> int:
        """Store the receipt of a retrieval made with `record=False` (e.g. once the reply it fed has
        arrived), exactly as `retrieve` would have; set and return its id."""
        return self._retriever.record(retrieval)

    def recorded(self, retrieval_id: int) -> Retrieval:
        """A stored receipt read back, with the memories it selected as they are now (forgotten ones left out)."""
        return self._retriever.recorded(retrieval_id)

    # -- reward -------------------------------------------------------------------

    def reward(self, reward: float, *, retrieval_id: int | None = None, memory_ids: Iterable[int] | None = None,
               task: str | None = None, alpha: float = DEFAULT_ALPHA, floor: float | None = None,
               source: str | None = None, allow_repeat: bool = False) -> list[dict[str, Any]]:
        """Apply Q ← Q + α(R − Q) to the memories a receipt selected (or to given ids, or those the newest receipt
        of a task id selected), atomically.

        The reward must lie in the bank's `reward_range()` ([-1, 1] by default); a second reward for
        the same receipt is refused unless `allow_repeat`. Either refusal writes nothing.
        Returns [{"id", "q_before", "q_after"}] in the order applied.
        """
        return self._ledger.reward_many([{"reward": reward, "retrieval_id": retrieval_id, "memory_ids": memory_ids,
                                          "task": task, "alpha": alpha, "floor": floor, "source": source,
                                          "allow_repeat": allow_repeat}])

    def reward_many(self, requests: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """Several rewards in one transaction (all or none); same fields as `reward`, or `task` (a task id: its
        newest receipt) instead of `retrieval_id`, and `scope` (the request acts in that scope alone; see
        `Ledger.reward_many`)."""
        return self._ledger.reward_many(requests)

    def task_receipt(self, task_id: str, scope: str | None = None, any_scope: bool = True) -> int:
        """The receipt a task id names (its newest), in `scope` or, with `any_scope`, the one scope it has."""
        return self._ledger.task_receipt(task_id, scope, any_scope)

    def reward_range(self) -> tuple[float, float]:
        """The rewards this bank accepts, (min, max) inclusive: [-1, 1] unless set with `set_reward_range`."""
        return self._ledger.reward_range()

    def set_reward_range(self, bounds: tuple[float, float] | None) -> tuple[float, float]:
        """Widen (or narrow) the rewards this bank accepts to `bounds` = (min, max), kept in its meta;
        None restores [-1, 1]. Returns the range in force. Rewards already given stay as they are."""
        return self._ledger.set_reward_range(bounds)

    def revise(self, memory_id: int, experience: str) -> bool:
        """Replace a memory's experience text in place (MemP's adjustment rule); intent, vector and Q stay.

        Returns False, changing nothing, when another memory already holds exactly that content.
        """
        return self._ledger.revise(memory_id, experience)

    def set_q(self, memory_id: int, q: float, source: str) -> None:
        """Assign Q outright (a `set` ledger row), e.g. after merging duplicates or a reset."""
        self._ledger.set_q(memory_id, q, source)
