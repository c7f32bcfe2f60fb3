"""`MemoryBank`: the whole truth of an agent's episodic memory, in one SQLite file (or a PostgreSQL database).

A memory is an (intent embedding, experience text, utility Q) triplet plus bookkeeping.
The bank holds the memories with their float32 vectors, a receipt for every retrieval, an
append-only reward ledger of which Q is a replay, and meta (embedder fingerprint,
similarity statistics); optionally an engine index over the vectors (sqlite-vec, HNSW).

Every write is one transaction, so parallel processes never lose an update, and a crash
leaves the bank at the last commit. The engine-specific parts live in `memrl_cli.store`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np

from memrl_cli.embed import LOCAL_SPEC, Embedder, check_fingerprint, fingerprint, get_embedder, normalise
from memrl_cli.errors import MemrlError
from memrl_cli.learn import DEFAULT_ALPHA, check_reward
from memrl_cli.retrieve import (CONDITIONED, SEARCH_WIDTH, Candidate, RetrieveParams, conditioned_utility, group_recall,
                                phase_a, phase_b, shrunk_q_stats, similarity_stats)
from memrl_cli.scan import MatrixIndex
from memrl_cli.store import Store, is_server_url, open_store

OUTCOMES = ("success", "failure", "unknown")
REWARD_FIELDS = {"reward", "retrieval_id", "memory_ids", "alpha", "floor", "source", "allow_repeat"}
MAX_TEXT_BYTES = 1_000_000
INDEXES = ("auto", "numpy", "bit", "vec", "exact", "hnsw")
IN_PROCESS = ("numpy", "bit")
QUERY_CACHE_ROWS = 10_000  # embeddings of recent query texts kept in the bank (1.5 KB each at 384-d)
RECALIBRATE_GROWTH = 0.1
Progress = Callable[[int], None]
MEMORY_COLUMNS = ("intent", "experience", "outcome", "task_id", "source", "q", "q_init", "visits", "created_at",
                  "updated_at", "last_used_at", "metadata", "content_hash", "embedding")


def now() -> str:
    """Current UTC time as ISO 8601 with microseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def content_hash(intent: str, experience: str) -> str:
    """Identity of a memory's content: exact duplicates share it."""
    return hashlib.sha256(f"{intent}\x00{experience}".encode()).hexdigest()


def _text(value: Any, name: str, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise MemrlError(f"{where}{name} must be a non-empty string")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
        raise MemrlError(f"{where}{name} is longer than {MAX_TEXT_BYTES} bytes")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise MemrlError(f"{where}{name} is not valid UTF-8 text") from None
    if "\x00" in value:
        raise MemrlError(f"{where}{name} contains a NUL byte (binary data is not text)")
    return value


def _number_list(value: Any) -> bool:
    """A list of ints and floats (not bools); the type-set test first, as vectors are long."""
    return isinstance(value, list) and (set(map(type, value)) <= {int, float} or all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in value))


@dataclass
class MemoryInput:
    """A validated memory to store."""

    intent: str
    experience: str
    outcome: str = "unknown"
    task_id: str | None = None
    source: str | None = None
    q: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)
    vector: list[float] | None = None

    @classmethod
    def parse(cls, obj: Any, where: str = "") -> MemoryInput:
        """Validate a dict (a JSONL line, API arguments); `where` prefixes error messages."""
        if not isinstance(obj, dict):
            raise MemrlError(f"{where}expected a JSON object, got {type(obj).__name__}")
        unknown = set(obj) - {"intent", "experience", "outcome", "task_id", "source", "q", "metadata", "vector"}
        if unknown:
            raise MemrlError(f"{where}unknown field(s) {', '.join(sorted(unknown))}")
        outcome = obj.get("outcome") or "unknown"
        if outcome not in OUTCOMES:
            raise MemrlError(f"{where}outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
        task_id = obj.get("task_id")
        if task_id is not None and not isinstance(task_id, (str, int)):
            raise MemrlError(f"{where}task_id must be a string or an integer")
        q = obj.get("q", 0.0)
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not math.isfinite(q):
            raise MemrlError(f"{where}q must be a finite number, got {q!r}")
        metadata = obj.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise MemrlError(f"{where}metadata must be a JSON object")
        vector = obj.get("vector")
        if vector is not None and not _number_list(vector):
            raise MemrlError(f"{where}vector must be a list of numbers")
        source = obj.get("source")
        if source is not None and not isinstance(source, str):
            raise MemrlError(f"{where}source must be a string")
        return cls(_text(obj.get("intent"), "intent", where), _text(obj.get("experience"), "experience", where),
                   outcome, None if task_id is None else str(task_id), source, float(q), metadata, vector)


@dataclass(frozen=True)
class IngestResult:
    """Where a memory went: its id, and False in `created` if it was an exact duplicate."""

    id: int
    created: bool


@dataclass
class Retrieval:
    """The answer to a retrieve: the selected memories (best first) and the receipt behind them."""

    id: int | None
    query: str
    memories: list[dict[str, Any]]
    candidates: list[Candidate]
    explored: bool
    params: RetrieveParams
    sim_stats: tuple[float, float] = (0.0, 1.0)  # the (mean, std) z(sim) used, as a receipt records them
    query_vector: np.ndarray | None = None  # stored with the receipt when there were candidates

    def to_dict(self) -> dict[str, Any]:
        """The JSON contract of `memrl retrieve --json`."""
        return {"retrieval_id": self.id, "query": self.query, "memories": self.memories}


class MemoryBank:
    """The memory bank. Open one per process (or per thread); it is cheap.

    `location` is a SQLite file path, or a `postgresql://` URL (see `memrl_cli.postgres`).
    `embedder` is an embedder spec (see `memrl_cli.embed`); by default the one the bank
    was made with, or `local` for a new bank. `index` chooses Phase-A search:

    - SQLite: `auto` (the bank's sqlite-vec index if it has one, else `numpy`), `numpy` (an
      in-process matrix, fastest for long-lived processes), `bit` (that matrix searched by
      sign-bit Hamming distance, then exact float re-scoring of a shortlist: approximate,
      fastest at large sizes; see `memrl_cli.scan`), or `vec` (sqlite-vec's KNN; builds the
      bank's sqlite-vec index if it has none: a second copy of every vector).
    - PostgreSQL: `auto` (the bank's HNSW index if it has one, else exact), `exact`
      (pgvector scan), or `hnsw` (pgvector HNSW, approximate; built if missing).

    Values read on every retrieve (meta, count, the in-process matrix) are cached and
    re-read only after a write: this connection's, or another's (SQLite's `PRAGMA
    data_version`; on PostgreSQL a change counter in meta that writers of meta and of new
    memories bump), read once per call.
    """

    def __init__(self, path: str | os.PathLike[str], embedder: str | None = None, *, index: str = "auto",
                 readonly: bool = False, create: bool = True) -> None:
        location = os.fspath(path)
        if index not in INDEXES:
            raise MemrlError(f"index must be one of {', '.join(INDEXES)}, got {index!r}")
        self.readonly = readonly
        self.store: Store = open_store(location, readonly=readonly, create=create)
        self.path = self.store.location
        self.conn = self.store.conn
        self.warnings: list[str] = list(self.store.warnings)
        if index not in self.store.indexes:
            self.close()
            raise MemrlError(f"index={index} is not available for a {self.store.kind} bank; "
                             f"use one of {', '.join(self.store.indexes)}")
        if index == "vec" and not self.vec.loaded:
            self.close()
            raise MemrlError(f"index=vec needs sqlite-vec, which is unavailable: {self.vec.reason}")
        self._depth = 0
        self._writes = 0  # transactions this object ended: part of the cache version
        self._cache: dict[str, Any] = {}
        self._cache_version: tuple[int, ...] | None = None
        self._pinned: tuple[int, ...] | None = None  # the change token read once for the current call
        self._scan = MatrixIndex(bits=index == "bit")
        self._scan_version: tuple[int, ...] | None = None
        self._index_mode = index
        self._inserted: list[tuple[int, Any]] = []  # (id, encoded vector) of the write's new memories
        self._embedder_spec = embedder
        self._embedder: Embedder | None = None
        recorded = self.meta("embedder")
        if recorded and embedder and recorded["spec"] != embedder:
            self.close()
            raise MemrlError(f"this bank was made with embedder {recorded['spec']!r}, not {embedder!r}; "
                             "omit --embedder to use the bank's own, or re-import into a new bank")
        if index in ("vec", "hnsw") and recorded and not self._engine_index_wanted(index):
            if readonly:
                self.close()
                raise MemrlError(f"this bank has no {index} index; open it writable to build one")
            self.set_index(index)

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

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """One atomic write (SQLite: `BEGIN IMMEDIATE` … `COMMIT`), rolled back on any error.

        Nested calls are savepoints inside the outer transaction, so a caller can make several bank
        operations (rewards, new memories, run records) one atomic step; an inner block that fails
        rolls back its own writes only, and a caller that catches its error can go on and commit.
        """
        if self.readonly:
            raise MemrlError(f"{self.path} was opened read-only")
        if self._depth:
            self._depth += 1
            try:
                with self.store.savepoint(f"memrl_nested_{self._depth}"):
                    yield self.conn
            except self.store.errors as exc:
                raise self.store.error(exc) from None
            finally:
                self._depth -= 1
            return
        try:
            self.store.begin()
        except self.store.errors as exc:
            raise self.store.error(exc) from None
        self._depth = 1
        try:
            yield self.conn
            self._depth = 0
            self.store.commit()
        except self.store.errors as exc:
            self._depth = 0
            self._rollback()
            raise self.store.error(exc) from None
        except BaseException:
            self._depth = 0
            self._rollback()
            raise
        finally:
            self._writes += 1

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Reads that all see the bank at one moment while other processes write (export, verify);
        inside a write transaction, that transaction's own view."""
        if self._depth:
            yield
            return
        try:
            with self.store.snapshot():
                yield
        except self.store.errors as exc:
            raise self.store.error(exc) from None

    def _rollback(self) -> None:
        try:
            self.store.rollback()
        except self.store.errors:  # the connection itself is gone: the server rolled back
            pass

    def _version(self) -> tuple[int, ...] | None:
        """Changes since the caches were filled (commits by other connections, writes by this one);
        None when the engine cannot tell."""
        if self._pinned is not None:
            return self._pinned
        version = self.store.version()
        return None if version is None else (*version, self._writes)

    @contextmanager
    def _one_version(self) -> Iterator[None]:
        """Read the change token once for a whole call, however many cached values it uses."""
        if self._pinned is not None or self._depth:
            yield
            return
        self._pinned = self._version()
        try:
            yield
        finally:
            self._pinned = None

    def _cached(self, key: str, compute: Callable[[], Any]) -> Any:
        """`compute()`, cached until the bank changes (always fresh inside a write transaction)."""
        if self._depth:
            return compute()
        version = self._version()
        if version is None:
            return compute()
        if version != self._cache_version:
            self._cache.clear()
            self._cache_version = version
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    def meta(self, key: str) -> Any:
        """A value from the meta table (JSON-decoded), or None."""
        return self.store.meta(key)

    def _set_meta(self, key: str, value: Any) -> None:
        self.store.set_meta(key, value)

    def _has_memories(self) -> bool:
        """Whether the bank holds a memory (cheaper than `count()` where nothing is cached)."""
        return self._cached("any", lambda: self.conn.execute("SELECT 1 FROM memories LIMIT 1").fetchone() is not None)

    def count(self) -> int:
        """Number of memories."""
        return self._cached("count", lambda: int(self.conn.execute("SELECT count(*) FROM memories").fetchone()[0]))

    # -- embedder ---------------------------------------------------------------

    @property
    def embedder(self) -> Embedder:
        """The bank's embedder, built and checked against the bank's fingerprint on first use."""
        if self._embedder is None:
            recorded = self.meta("embedder")
            spec = self._embedder_spec or (recorded["spec"] if recorded else "local")
            embedder = get_embedder(spec)
            if recorded:
                check_fingerprint(recorded, embedder)
            self._embedder = embedder
        return self._embedder

    @property
    def dim(self) -> int | None:
        """The vector dimension, once the bank has an embedder recorded."""
        def read() -> int | None:
            recorded = self.meta("embedder")
            return int(recorded["dim"]) if recorded else None
        return self._cached("dim", read)

    def _record_embedder(self) -> int:
        """Record the embedder's fingerprint on the first write; return the dimension."""
        recorded = self.meta("embedder")
        if recorded:
            return int(recorded["dim"])
        embedder = self.embedder
        self._set_meta("embedder", fingerprint(embedder))
        self.store.prepare_vectors(embedder.dim)
        if self._index_mode in ("vec", "hnsw"):  # asked for on a new bank: index from the first memory on
            self.store.build_index(self._index_mode, embedder.dim)
        return embedder.dim

    def _vectors_for(self, texts: list[str], given: list[list[float] | None], progress: Progress | None) -> np.ndarray:
        """Normalised vectors: the given ones (checked), the rest embedded in one pass."""
        dim = self.dim
        missing = [i for i, v in enumerate(given) if v is None]
        if missing:
            dim = self.embedder.dim
        else:
            dim = dim or len(given[0])  # type: ignore[arg-type]
        out = np.empty((len(texts), dim), dtype=np.float32)
        rows = [i for i, vector in enumerate(given) if vector is not None]
        for i in rows:
            if len(given[i]) != dim:  # type: ignore[arg-type]
                raise MemrlError(f"vector has dimension {len(given[i])}, the bank's embedder gives {dim}")  # type: ignore[arg-type]
        if rows:  # one array and one normalise for all given vectors
            out[rows] = normalise(np.array([given[i] for i in rows], dtype=np.float32))
        step = 64
        for start in range(0, len(missing), step):
            chunk = missing[start:start + step]
            out[chunk] = self.embedder.embed([texts[i] for i in chunk])
            if progress:
                progress(len(chunk))
        return out

    # -- the vector index ---------------------------------------------------------

    def _engine_index_wanted(self, kind: str) -> bool:
        """Whether the bank already has the engine index of this kind (sqlite-vec, HNSW)."""
        info = self.store.index_info()
        return info["kind"] == kind and (kind != "vec" or info.get("state") == "ok")

    def set_index(self, kind: str) -> dict[str, Any]:
        """Build (or rebuild) the engine's optional index, or drop it with `none`; return its description.

        SQLite: `vec` keeps a sqlite-vec copy of every vector (faster one-shot retrieval on large
        banks, twice the file size). PostgreSQL: `hnsw` (approximate; `exact` drops it).
        """
        if kind not in ("vec", "hnsw", "none", "exact"):
            raise MemrlError(f"index must be vec or none (SQLite), hnsw or exact (PostgreSQL), got {kind!r}")
        with self.transaction():
            if kind in ("none", "exact"):
                self.store.drop_index()
            elif self.dim is not None:
                self.store.build_index(kind, self.dim)
            else:
                raise MemrlError("the bank is empty: ingest a memory first, then build the index")
        return self.store.index_info()

    def rebuild_index(self) -> int:
        """Rebuild the SQLite bank's sqlite-vec index from the stored vectors; return the number indexed."""
        if self.store.kind != "sqlite" or self.store.index_info()["kind"] != "vec":
            raise MemrlError("this bank has no sqlite-vec index to rebuild (build one with `memrl doctor --index vec`)")
        self.set_index("vec")
        return self.count()

    def _load_matrix(self) -> MatrixIndex:
        """The in-process index, brought up to date if the bank changed (memories are append-only)."""
        version = self._version()
        if version == self._scan_version and not self._depth:
            return self._scan
        scan = self._scan
        if self._depth:  # inside a write: uncommitted rows may roll back, so search them without keeping them
            scan = MatrixIndex(bits=self._scan.bits)
            scan.extend(self._scan.ids, self._scan.matrix)
        rows = self.conn.execute("SELECT id, embedding FROM memories WHERE id > ? ORDER BY id",
                                 (scan.last_id,)).fetchall()
        if rows:
            ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            scan.extend(ids, self.store.decode([r[1] for r in rows]))
        if not self._depth:
            self._scan_version = version
        return scan

    def search(self, vector: np.ndarray, k1: int, threshold: float,
               sources: Sequence[str] = ()) -> tuple[np.ndarray, np.ndarray]:
        """Phase A: (ids, similarities) of the top-k1 memories at or above `threshold`, best first,
        among those retrieval may return: never a quarantined memory, and with `sources`, only
        memories whose source matches one of these shell-style patterns (`Store.matches`)."""
        mode = self._index_mode
        hidden = self.quarantined()
        if mode not in IN_PROCESS and (mode != "auto" or self._cached("index_ready", self.store.index_ready)):
            if mode == "auto":  # the engine index the bank records (cached)
                mode = self._cached("index_kind", lambda: self.store.index_info()["kind"])
            ids, sims = self.store.knn(vector, k1, mode, hidden, sources)
            return phase_a(sims, ids, k1, threshold)
        if mode == "auto" and self.vec is not None and not self.vec.loaded and "numpy-scan" not in self.warnings \
                and self.store.index_info()["kind"] == "vec":
            self.warnings.append("numpy-scan")
            print(f"memrl: warning: the bank's sqlite-vec index is unusable, retrieving by numpy scan: "
                  f"{self.vec.reason}", file=sys.stderr)
        scan = self._load_matrix()
        mask = None
        if len(hidden) or sources:
            mask = ~np.isin(scan.ids, hidden)
            if sources:
                condition, args = self.store.matches("source", sources)
                mask &= np.isin(scan.ids, [r[0] for r in self.conn.execute(
                    f"SELECT id FROM memories WHERE {condition}", args)])
        return scan.search(vector, k1, threshold, mask)

    def quarantined(self) -> np.ndarray:
        """Ids of the quarantined memories, ascending (see `memrl_cli.hygiene`)."""
        return self._cached("quarantined", lambda: np.array(
            [r[0] for r in self.conn.execute("SELECT id FROM memories WHERE quarantined_at IS NOT NULL ORDER BY id")],
            dtype=np.int64))

    # -- similarity statistics for z(sim) ----------------------------------------

    def similarity_stats(self) -> tuple[float, float]:
        """(mean, std) used for z(sim): a user override, else the bank's own statistics."""
        def read() -> tuple[float, float]:
            override = self.meta("sim_stats_override")
            if override:
                return float(override["mean"]), float(override["std"])
            stats = self.meta("sim_stats")
            return (float(stats["mean"]), float(stats["std"])) if stats else (0.0, 1.0)
        return self._cached("sim_stats", read)

    def calibrate(self, mean: float | None = None, std: float | None = None, clear: bool = False) -> dict[str, Any]:
        """Recompute the bank's similarity statistics now, or set/clear a fixed override."""
        if clear and (mean is not None or std is not None):
            raise MemrlError("--clear drops the fixed statistics; give it alone, or --mean and --std alone")
        with self.transaction():
            if clear:
                self.store.delete_meta("sim_stats_override")
            if mean is not None or std is not None:
                if mean is None or std is None or not (math.isfinite(mean) and math.isfinite(std)) or std <= 0:
                    raise MemrlError("give both --mean and --std (std > 0) to fix the similarity statistics")
                self._set_meta("sim_stats_override", {"mean": mean, "std": std, "set_at": now()})
            else:
                self._recalibrate()
        return {"stats": self.meta("sim_stats"), "override": self.meta("sim_stats_override"),
                "used": dict(zip(("mean", "std"), self.similarity_stats()))}

    def _recalibrate(self, force: bool = True) -> None:
        """Refresh `sim_stats` from the stored intents when the bank grew by 10% (or when forced)."""
        n = self.count()
        stats = self.meta("sim_stats")
        if not force and stats and n < stats["memories"] * (1 + RECALIBRATE_GROWTH) and n - stats["memories"] < 1000:
            return
        ids = np.array([r[0] for r in self.conn.execute("SELECT id FROM memories ORDER BY id")], dtype=np.int64)
        if len(ids) < 2:
            return
        rng = np.random.default_rng(n)  # deterministic, so a resumed run calibrates as an uninterrupted one
        chosen = rng.choice(ids, size=min(len(ids), 2000), replace=False).tolist()
        vectors = self.store.decode([row[0] for row in self._by_ids("embedding", "memories", chosen)])
        mean, std, pairs = similarity_stats(vectors, rng)
        self._set_meta("sim_stats", {"mean": mean, "std": std, "memories": n, "pairs": pairs,
                                     "method": "cosine between stored intents", "updated_at": now()})

    # -- ingest -------------------------------------------------------------------

    def ingest(self, intent: str, experience: str, outcome: str = "unknown", *, task_id: str | None = None,
               source: str | None = None, q: float = 0.0, metadata: dict[str, Any] | None = None,
               vector: list[float] | None = None) -> IngestResult:
        """Store one memory; an exact duplicate (same intent and experience) returns the existing id."""
        record = MemoryInput.parse({"intent": intent, "experience": experience, "outcome": outcome,
                                    "task_id": task_id, "source": source, "q": q, "metadata": metadata,
                                    "vector": vector})
        return self.ingest_many([record])[0]

    def ingest_many(self, records: Iterable[MemoryInput | dict[str, Any]], progress: Progress | None = None) -> list[IngestResult]:
        """Store many memories atomically: all of them, or (on any error) none."""
        items = [r if isinstance(r, MemoryInput) else MemoryInput.parse(r, f"record {i + 1}: ")
                 for i, r in enumerate(records)]
        if not items:
            return []
        vectors = self._vectors_for([m.intent for m in items], [m.vector for m in items], progress)
        stamp = now()
        results: list[IngestResult] = []
        with self.transaction() as conn:
            self._begin_insert(vectors)
            rows = [self._memory_row(item, vector, stamp) for item, vector in zip(items, vectors)]
            for item, row, new_id in zip(items, rows, self.store.insert_memories(MEMORY_COLUMNS, rows)):
                if new_id is None:
                    existing = conn.execute("SELECT id FROM memories WHERE content_hash = ?",
                                            (content_hash(item.intent, item.experience),)).fetchone()
                    results.append(IngestResult(int(existing[0]), False))
                else:
                    self._inserted.append((new_id, row[-1]))
                    results.append(IngestResult(new_id, True))
            self._end_insert()
        return results

    def _begin_insert(self, vectors: np.ndarray) -> None:
        """Inside a write: record the embedder and check the vectors' dimension."""
        dim = self._record_embedder()
        if len(vectors) and vectors.shape[1] != dim:
            raise MemrlError(f"vectors have dimension {vectors.shape[1]}, this bank's is {dim}")
        self._inserted = []

    def _insert_memory(self, item: MemoryInput, vector: np.ndarray, stamp: str,
                       stored: dict[str, Any] | None = None) -> int | None:
        """Insert one memory; None if its content is already stored.

        `stored` carries an imported memory's state: q_init, visits and timestamps.
        """
        row = self._memory_row(item, vector, stamp, stored)
        new_id = self.store.insert_memories(MEMORY_COLUMNS, [row])[0]
        if new_id is not None:
            self._inserted.append((new_id, row[-1]))
        return new_id

    def _memory_row(self, item: MemoryInput, vector: np.ndarray, stamp: str,
                    stored: dict[str, Any] | None = None) -> tuple[Any, ...]:
        """A memory's values in `MEMORY_COLUMNS` order, its vector encoded for the store."""
        stored = stored or {}
        return (item.intent, item.experience, item.outcome, item.task_id, item.source, item.q,
                stored.get("q_init", item.q), stored.get("visits", 0), stored.get("created_at", stamp),
                stored.get("updated_at", stamp), stored.get("last_used_at"), json.dumps(item.metadata),
                content_hash(item.intent, item.experience), self.store.encode(vector))

    def _end_insert(self) -> None:
        """Inside a write that added memories: index them in the engine; refresh calibration."""
        self.store.add_to_index(self._inserted)
        self._recalibrate(force=False)

    # -- retrieve -----------------------------------------------------------------

    def query_vector(self, query: str, vector: list[float] | None = None) -> np.ndarray:
        """The unit vector of a query: the given one (checked), else the embedder's."""
        if vector is not None:
            dim = self.dim
            if dim is not None and len(vector) != dim:
                raise MemrlError(f"vector has dimension {len(vector)}, the bank's embedder gives {dim}")
            return normalise(np.asarray(vector, dtype=np.float32))[0]
        return self.embedder.embed([query])[0]

    def _embed_query(self, query: str) -> tuple[np.ndarray, str | None]:
        """The query's vector, from the bank's query cache or else the embedder (with the cache key to fill).

        Only the local model is cached: loading it is what a short-lived process pays for. A remote
        embedder is asked every time, so a model changed behind its name is still caught by the probe.
        """
        spec = self._cached("embedder_spec", lambda: (self.meta("embedder") or {}).get("spec", ""))
        if spec != LOCAL_SPEC:
            return self.embedder.embed([query])[0], None
        key = hashlib.sha256(f"{spec}\x00{query}".encode()).hexdigest()
        row = self.conn.execute("SELECT vector FROM query_cache WHERE key = ?", (key,)).fetchone()
        if row is not None:
            return np.frombuffer(bytes(row[0]), dtype=np.float32), None
        return self.embedder.embed([query])[0], key

    def retrieve(self, query: str, params: RetrieveParams | None = None, *, vector: list[float] | None = None,
                 record: bool = True) -> Retrieval:
        """Both phases; with `record`, the receipt is stored and its id returned for `reward`."""
        with self._one_version():
            return self._retrieve(query, params, vector, record)

    def _retrieve(self, query: str, params: RetrieveParams | None, vector: list[float] | None,
                  record: bool) -> Retrieval:
        params = params or RetrieveParams()
        query = _text(query, "query", "")
        candidates: list[Candidate] = []
        explored = False
        sim_stats = self.similarity_stats() if params.sim_mean is None or params.sim_std is None \
            else (params.sim_mean, params.sim_std)  # the receipt records the statistics actually used
        rows: dict[int, tuple] = {}
        cache: tuple[str, np.ndarray] | None = None
        if self._has_memories():
            if vector is None:  # a repeated query text skips the embedding model (the receipt's write fills the cache)
                query_vec, key = self._embed_query(query)
                cache = (key, query_vec) if key else None
            else:
                query_vec = self.query_vector(query, vector)
            id_list, sim_list = self.recall(query_vec, params)
            if id_list:  # Q and text of every candidate in one read: the selected ones are among them
                rows = {r[0]: r for r in self._by_ids("id, q, intent, experience, outcome, visits", "memories", id_list)}
                candidates = [Candidate(i, s, float(rows[i][1]), visits=int(rows[i][5]))
                              for i, s in zip(id_list, sim_list)]
                if params.selector in CONDITIONED:
                    self._condition(candidates, query_vec)
                q_stats = self.q_stats() if params.selector in ("calibrated", "ucb") else (0.0, 1.0)
                explored = phase_b(candidates, params, sim_stats, random.Random(params.seed), q_stats)
        selected = sorted((c for c in candidates if c.selected_rank is not None), key=lambda c: c.selected_rank or 0)
        memories = [{"id": c.memory_id, "intent": rows[c.memory_id][2], "experience": rows[c.memory_id][3],
                     "outcome": rows[c.memory_id][4], "similarity": c.similarity, "q": c.q, "score": c.score}
                    for c in selected]
        retrieval_id = self._write_receipt(query, params, sim_stats, candidates, selected, explored, cache,
                                           query_vec if candidates else None) if record else None
        return Retrieval(retrieval_id, query, memories, candidates, explored, params, sim_stats,
                         query_vec if candidates else None)

    def record(self, retrieval: Retrieval) -> int:
        """Store the receipt of a retrieval made with `record=False` (e.g. once the reply it fed has
        arrived), exactly as `retrieve` would have; set and return its id."""
        if retrieval.id is not None:
            raise MemrlError(f"retrieval {retrieval.id} is already recorded")
        selected = sorted((c for c in retrieval.candidates if c.selected_rank is not None),
                          key=lambda c: c.selected_rank or 0)
        retrieval.id = self._write_receipt(retrieval.query, retrieval.params, retrieval.sim_stats,
                                           retrieval.candidates, selected, retrieval.explored,
                                           query_vec=retrieval.query_vector)
        return retrieval.id

    def recall(self, vector: np.ndarray, params: RetrieveParams) -> tuple[list[int], list[float]]:
        """Phase A: (ids, similarities) of the candidates, best first (grouped unless `recall="memories"`)."""
        if params.recall == "memories":
            ids, sims = self.search(vector, params.k1, params.threshold, params.sources)
            return ids.tolist(), sims.tolist()
        ids, sims = self.search(vector, min(4096, max(params.k1, params.pool) * SEARCH_WIDTH), params.threshold,
                                 params.sources)
        if not len(ids):
            return [], []
        return group_recall(ids, sims, self._stored_vectors(ids), params.k1, params.group_threshold, params.pool)

    def _stored_vectors(self, ids: np.ndarray) -> np.ndarray:
        """The stored vectors of `ids`, in order: rows of the in-process index when it holds them all
        (stored vectors never change), else one read."""
        held = self._scan.ids
        rows = np.minimum(np.searchsorted(held, ids), max(len(held) - 1, 0))
        if len(held) and np.array_equal(held[rows], ids):
            return self._scan.matrix[rows]
        found = {r[0]: r[1] for r in self._by_ids("id, embedding", "memories", ids.tolist())}
        return self.store.decode([found[i] for i in ids.tolist()]).astype(np.float32)

    def q_stats(self) -> tuple[float, float]:
        """Bank-level (mean, std) of Q, shrunk to a prior: the `calibrated` and `ucb` selectors' z(Q)."""
        def read() -> tuple[float, float]:
            n, mean, square = self.conn.execute("SELECT COUNT(*), AVG(q), AVG(q * q) FROM memories").fetchone()
            return shrunk_q_stats(int(n or 0), float(mean or 0.0), float(square or 0.0))
        return self._cached("q_stats", read)

    def _condition(self, candidates: list[Candidate], query_vec: np.ndarray) -> None:
        """Set each candidate's query-conditioned utility from its rewarded past retrievals (receipts + ledger)."""
        past: dict[int, list[tuple[float, float]]] = {c.memory_id: [] for c in candidates}
        ids = sorted(past)
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            for mid, reward, blob in self.conn.execute(
                    "SELECT w.memory_id, w.reward, r.query_vector FROM rewards w JOIN retrievals r ON r.id = w.retrieval_id "
                    f"WHERE w.kind = 'reward' AND r.query_vector IS NOT NULL AND w.memory_id IN ({','.join('?' * len(chunk))})",
                    chunk):
                past[mid].append((float(np.frombuffer(bytes(blob), dtype=np.float32) @ query_vec), float(reward)))
        for c in candidates:
            c.utility = conditioned_utility(c.q, past[c.memory_id]) if past[c.memory_id] else None

    def _write_receipt(self, query: str, params: RetrieveParams, sim_stats: tuple[float, float],
                       candidates: list[Candidate], selected: list[Candidate], explored: bool,
                       cache: tuple[str, np.ndarray] | None = None, query_vec: np.ndarray | None = None) -> int:
        stamp = now()
        with self.transaction() as conn:
            # The candidates' foreign keys lock their memories (and the selected ones' last_used_at
            # changes them): lock them all first, in id order as rewards do, so the two never deadlock.
            self._lock("memories", {c.memory_id for c in candidates})
            if cache is not None:
                conn.execute("INSERT INTO query_cache (key, vector, created_at) VALUES (?, ?, ?) ON CONFLICT (key) "
                             "DO UPDATE SET created_at = excluded.created_at",
                             (cache[0], cache[1].astype(np.float32).tobytes(), stamp))
                self.store.trim_query_cache(QUERY_CACHE_ROWS)
            rid = self.store.insert("INSERT INTO retrievals (query, params, sim_mean, sim_std, explored, created_at, "
                                    "query_vector) VALUES (?,?,?,?,?,?,?)",
                                    (query, json.dumps(params.to_dict()), sim_stats[0], sim_stats[1], int(explored),
                                     stamp, None if query_vec is None else query_vec.astype(np.float32).tobytes()))
            assert rid is not None
            conn.executemany("INSERT INTO retrieval_candidates (retrieval_id, memory_id, recall_rank, similarity, q, "
                             "z_sim, z_q, score, selected_rank) VALUES (?,?,?,?,?,?,?,?,?)",
                             [(rid, c.memory_id, rank, c.similarity, c.q, c.z_sim, c.z_q, c.score, c.selected_rank)
                              for rank, c in enumerate(candidates)])
            conn.executemany("UPDATE memories SET last_used_at = ? WHERE id = ?",
                             [(stamp, mid) for mid in sorted(c.memory_id for c in selected)])
        return rid

    # -- reward -------------------------------------------------------------------

    def reward(self, reward: float, *, retrieval_id: int | None = None, memory_ids: Iterable[int] | None = None,
               alpha: float = DEFAULT_ALPHA, floor: float | None = None, source: str | None = None,
               allow_repeat: bool = False) -> list[dict[str, Any]]:
        """Apply Q ← Q + α(R − Q) to the memories a receipt selected (or to given ids), atomically.

        A second reward for the same receipt is refused unless `allow_repeat`.
        Returns [{"id", "q_before", "q_after"}] in the order applied.
        """
        return self.reward_many([{"reward": reward, "retrieval_id": retrieval_id, "memory_ids": memory_ids,
                                  "alpha": alpha, "floor": floor, "source": source, "allow_repeat": allow_repeat}])

    def reward_many(self, requests: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """Several rewards in one transaction (all or none); same fields as `reward`."""
        checked = [self._check_reward_request(r, i) for i, r in enumerate(requests)]
        stamp = now()
        memory_ids = [mid for c in checked for mid in (c[1] or ())]
        if self.store.single_statement_writes and not self._depth and checked \
                and all(c[0] is None for c in checked) and len(set(memory_ids)) == len(memory_ids):
            # Given memories, each once: one statement that locks, updates and ledgers (one round trip)
            entries = [(None, mid, r, a, f, source) for _, ids, r, a, f, source, _ in checked for mid in ids]
            return [{"id": m, "q_before": b, "q_after": q} for m, b, q in self._single_statement(
                lambda: self.store.apply_rewards(entries, stamp))]
        updates: list[dict[str, Any]] = []
        with self.transaction() as conn:
            # Lock what this write reads and then changes, in id order (no deadlock between writers):
            # the receipts first (one reward per receipt), then the memories whose Q moves.
            self._lock("retrievals", {c[0] for c in checked if c[0] is not None})
            rewarded: set[int] = set()
            resolved = []
            for rid, ids, r, a, f, source, repeat in checked:
                if rid is not None:
                    if conn.execute("SELECT 1 FROM retrievals WHERE id = ?", (rid,)).fetchone() is None:
                        raise MemrlError(f"unknown retrieval id {rid}")
                    if not repeat and (rid in rewarded or conn.execute(
                            "SELECT 1 FROM rewards WHERE retrieval_id = ? LIMIT 1", (rid,)).fetchone()):
                        raise MemrlError(f"retrieval {rid} was already rewarded; pass --allow-repeat to reward it again")
                    rewarded.add(rid)
                    ids = [row[0] for row in conn.execute(
                        "SELECT memory_id FROM retrieval_candidates WHERE retrieval_id = ? AND selected_rank IS NOT "
                        "NULL ORDER BY selected_rank", (rid,))]
                resolved.append((rid, ids, r, a, f, source))
            self._lock("memories", {mid for entry in resolved for mid in entry[1]})
            # In request order, in runs of requests whose memories are distinct (one pass each): a memory that
            # recurs starts a new run, so it moves from the Q the run before left
            runs: list[list[tuple]] = [[]]
            seen: set[int] = set()
            for rid, ids, r, a, f, source in resolved:
                if not seen.isdisjoint(ids):
                    runs.append([])
                    seen = set()
                seen.update(ids)
                runs[-1] += [(rid, mid, r, a, f, source) for mid in ids]
            for run in runs:
                updates += [{"id": m, "q_before": b, "q_after": q} for m, b, q in self.store.apply_rewards(run, stamp)]
        return updates

    def _single_statement(self, write: Callable[[], Any]) -> Any:
        """A write that is one statement, its own transaction on the server (all or nothing)."""
        if self.readonly:
            raise MemrlError(f"{self.path} was opened read-only")
        try:
            return write()
        except self.store.errors as exc:
            raise self.store.error(exc) from None
        finally:
            self._writes += 1

    def _lock(self, table: str, ids: set[int]) -> None:
        """Inside a write: lock rows this transaction reads and then changes, in id order (a no-op on
        SQLite, whose writers are already serialised)."""
        if self.store.lock:
            self._by_ids("id", table, ids, self.store.lock)

    def _by_ids(self, columns: str, table: str, ids: Iterable[int], suffix: str = "") -> list[tuple]:
        """`SELECT columns FROM table WHERE id IN ids ORDER BY id` (+ `suffix`), in chunks of 500 ids."""
        ordered, rows = sorted(ids), []
        for start in range(0, len(ordered), 500):
            chunk = ordered[start:start + 500]
            rows += self.conn.execute(f"SELECT {columns} FROM {table} WHERE id IN ({','.join('?' * len(chunk))}) "
                                      f"ORDER BY id{suffix}", chunk).fetchall()
        return rows

    @staticmethod
    def _check_reward_request(request: dict[str, Any], i: int) -> tuple:
        where = f"reward {i + 1}: " if i else ""
        unknown = set(request) - REWARD_FIELDS
        if unknown:
            raise MemrlError(f"{where}unknown field(s) {', '.join(sorted(map(str, unknown)))}; "
                             f"use {', '.join(sorted(REWARD_FIELDS))}")
        rid, ids = request.get("retrieval_id"), request.get("memory_ids")
        if (rid is None) == (ids is None):
            raise MemrlError(f"{where}give either a retrieval id or memory ids, not both or neither")
        if rid is not None and (isinstance(rid, bool) or not isinstance(rid, int)):
            raise MemrlError(f"{where}retrieval id must be an integer, got {rid!r}")
        if ids is not None:
            try:
                ids = list(dict.fromkeys(ids))  # each memory once, in the order given
            except TypeError:
                ids = None
            if not ids or not all(isinstance(m, int) and not isinstance(m, bool) for m in ids):
                raise MemrlError(f"{where}memory ids must be a non-empty list of integers")
        try:
            r, a, f = check_reward(request.get("reward"), request.get("alpha", DEFAULT_ALPHA)
                                   if request.get("alpha") is not None else DEFAULT_ALPHA, request.get("floor"))
        except MemrlError as exc:
            raise MemrlError(f"{where}{exc}") from None
        return rid, ids, r, a, f, request.get("source"), bool(request.get("allow_repeat"))

    def revise(self, memory_id: int, experience: str) -> bool:
        """Replace a memory's experience text in place (MemP's adjustment rule); intent, vector and Q stay.

        Returns False, changing nothing, when another memory already holds exactly that content.
        """
        experience = _text(experience, "experience", "")
        with self.transaction() as conn:
            row = conn.execute(f"SELECT intent FROM memories WHERE id = ?{self.store.lock}", (memory_id,)).fetchone()
            if row is None:
                raise MemrlError(f"unknown memory id {memory_id}")
            digest = content_hash(row[0], experience)
            if conn.execute("SELECT 1 FROM memories WHERE content_hash = ? AND id <> ?", (digest, memory_id)).fetchone():
                return False
            conn.execute("UPDATE memories SET experience = ?, content_hash = ?, updated_at = ? WHERE id = ?",
                         (experience, digest, now(), memory_id))
        return True

    def set_q(self, memory_id: int, q: float, source: str) -> None:
        """Assign Q outright (a `set` ledger row), e.g. after merging duplicates or a reset."""
        if not math.isfinite(q):
            raise MemrlError("q must be a finite number")
        with self.transaction() as conn:
            row = conn.execute(f"SELECT q FROM memories WHERE id = ?{self.store.lock}", (memory_id,)).fetchone()
            if row is None:
                raise MemrlError(f"unknown memory id {memory_id}")
            stamp = now()
            conn.execute("UPDATE memories SET q = ?, updated_at = ? WHERE id = ?", (q, stamp, memory_id))
            conn.execute("INSERT INTO rewards (memory_id, kind, q_before, q_after, created_at, source) "
                         "VALUES (?, 'set', ?, ?, ?, ?)", (memory_id, row[0], q, stamp, source))
