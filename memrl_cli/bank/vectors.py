"""A bank's embedder and the vectors it gives: built on first use and checked against the
fingerprint the bank recorded on its first write, given vectors checked and normalised, and
query vectors remembered in the bank's query cache (so a repeated query skips the model).
"""

from __future__ import annotations

import hashlib

import numpy as np

from memrl_cli.bank.connection import BankConnection
from memrl_cli.bank.embedders import LOCAL_SPEC, Embedder, check_fingerprint, fingerprint, get_embedder, normalise
from memrl_cli.errors import MemrlError
from memrl_cli.bank.records import Progress

QUERY_CACHE_ROWS = 10_000  # embeddings of recent query texts kept in the bank (1.5 KB each at 384-d)
EMBED_BATCH = 64  # texts per embedder call (and per progress report)


class BankVectors:
    """The embedder of one bank: `spec` as asked for (None: the bank's own, or `local` for a new bank)."""

    def __init__(self, db: BankConnection, spec: str | None = None) -> None:
        self.db = db
        self.spec = spec
        self._embedder: Embedder | None = None

    @property
    def embedder(self) -> Embedder:
        """The bank's embedder, built and checked against the bank's fingerprint on first use."""
        if self._embedder is None:
            recorded = self.db.meta("embedder")
            spec = self.spec or (recorded["spec"] if recorded else "local")
            embedder = get_embedder(spec)
            if recorded:
                check_fingerprint(recorded, embedder)
            self._embedder = embedder
        return self._embedder

    def dim(self) -> int | None:
        """The vector dimension, once the bank has an embedder recorded."""
        def read() -> int | None:
            recorded = self.db.meta("embedder")
            return int(recorded["dim"]) if recorded else None
        return self.db.cached("dim", read)

    def record_embedder(self) -> tuple[int, bool]:
        """Inside a write: record the embedder's fingerprint if this is the bank's first write (and fix
        the store's vector dimension); (the dimension, whether it was recorded now)."""
        recorded = self.db.meta("embedder")
        if recorded:
            return int(recorded["dim"]), False
        embedder = self.embedder
        self.db.store.set_meta("embedder", fingerprint(embedder))
        self.db.store.prepare_vectors(embedder.dim)
        return embedder.dim, True

    def vectors_for(self, texts: list[str], given: list[list[float] | None], progress: Progress | None) -> np.ndarray:
        """Normalised vectors: the given ones (checked), the rest embedded in one pass, each distinct text
        once (a file of many memories per task embeds each task once); `progress` counts rows."""
        dim = self.dim()
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
        rows_of: dict[str, list[int]] = {}  # each distinct text embedded once: its rows share the vector
        for i in missing:
            rows_of.setdefault(texts[i], []).append(i)
        distinct = list(rows_of)
        for start in range(0, len(distinct), EMBED_BATCH):
            chunk = distinct[start:start + EMBED_BATCH]
            embedded = self.embedder.embed(chunk)
            done = 0
            for text, vector in zip(chunk, embedded):
                out[rows_of[text]] = vector
                done += len(rows_of[text])
            if progress:
                progress(done)
        return out

    def query_vector(self, query: str, vector: list[float] | None = None) -> np.ndarray:
        """The unit vector of a query: the given one (checked), else the embedder's."""
        if vector is not None:
            dim = self.dim()
            if dim is not None and len(vector) != dim:
                raise MemrlError(f"vector has dimension {len(vector)}, the bank's embedder gives {dim}")
            return normalise(np.asarray(vector, dtype=np.float32))[0]
        return self.embedder.embed([query])[0]

    def embed_query(self, query: str) -> tuple[np.ndarray, str | None]:
        """The query's vector, from the bank's query cache or else the embedder (with the cache key to fill).

        Only the local model is cached: loading it is what a short-lived process pays for. A remote
        embedder is asked every time, so a model changed behind its name is still caught by the probe.
        """
        spec = self.db.cached("embedder_spec", lambda: (self.db.meta("embedder") or {}).get("spec", ""))
        if spec != LOCAL_SPEC:
            return self.embedder.embed([query])[0], None
        key = hashlib.sha256(f"{spec}\x00{query}".encode()).hexdigest()
        cached = self.db.store.cached_query(key)
        if cached is not None:
            return np.frombuffer(bytes(cached), dtype=np.float32), None
        return self.embedder.embed([query])[0], key

    def cache_query(self, key: str, vector: np.ndarray, stamp: str) -> None:
        """Inside a write: remember a query's vector under its cache key (`embed_query`), keeping the
        QUERY_CACHE_ROWS most recent."""
        self.db.store.cache_query(key, vector.astype(np.float32).tobytes(), stamp)
        self.db.store.trim_query_cache(QUERY_CACHE_ROWS)
