"""The SQLite store, `SqliteStore`: a bank in one file, over the driver of `memrl_cli.store.sqlite_driver`
(sqlite-vec's index when the extension loads, else a numpy scan over the raw vectors)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from typing import Any

import numpy as np

from memrl_cli.errors import BankBusyError, MemrlError
from memrl_cli.method.learning import number
from memrl_cli.method.retrieval import SIM_RESOLUTION, Filters
from memrl_cli.store import migrations as schema
from memrl_cli.store import sqlite_schema
from memrl_cli.store.bank_queries import ERASED, VISIBLE
from memrl_cli.store.base import SQLITE_INDEXES, Store
from memrl_cli.store.sqlite_driver import (BUSY_TIMEOUT_MS, DatabaseError, Error, MappedConnection, has_sqlite_header,
                                           connect, create_bank_file, driver, load_vec, refuse_foreign_file, scratch)

KNN_MAX = 4096  # sqlite-vec's largest k


class SqliteStore(Store):
    """A bank in one SQLite file: WAL, `BEGIN IMMEDIATE` writes, raw float32 vectors in `memories`,
    and an optional sqlite-vec index (`memory_index`, a second copy of every vector)."""

    kind = "sqlite"
    indexes = SQLITE_INDEXES
    errors = (Error,)

    def __init__(self, path: str, *, readonly: bool = False, create: bool = True,
                 busy_timeout: float | None = None) -> None:
        self.location = self.path = path
        self.readonly = readonly
        self.busy_ms = BUSY_TIMEOUT_MS if busy_timeout is None else max(1, int(busy_timeout * 1000))
        exists = os.path.exists(path)
        if not exists and (readonly or not create):
            raise MemrlError(f"no bank at {path} (create one with `memrl ingest`)")
        if exists and os.path.isdir(path):
            raise MemrlError(f"{path} is a directory, not a bank file")
        if not exists:
            parent = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(parent):
                raise MemrlError(f"cannot create a bank at {path}: the directory {parent} does not exist")
        else:
            refuse_foreign_file(path)  # before connecting: nothing may be written to a file that is not a bank
        self.warnings: list[str] = []
        try:
            if not exists:
                create_bank_file(path)
            self.conn = MappedConnection(connect(path, readonly=readonly, busy_ms=self.busy_ms), self.error)
            self.conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            self.warnings += sqlite_schema.check_trusted(self.conn, scratch, path)
            if not readonly:
                if self.conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    self.conn.execute("PRAGMA journal_mode = WAL")
                self.conn.execute("PRAGMA synchronous = NORMAL")
                sqlite_schema.migrate(self.conn)
            elif self.schema_version() != schema.LATEST:
                raise MemrlError(f"{path} is not a memrl bank at schema {schema.LATEST}; open it writable to migrate")
            schema.check_meta(self.conn)
            self.vec = load_vec(self.conn)
            self._index_ignored = False
            self._check_index()
        except BaseException as exc:
            if hasattr(self, "conn"):
                self.conn.close()  # a refused file: no connection (nor its -wal and -shm files) left behind
            if isinstance(exc, DatabaseError):
                raise self.error(exc) from None
            raise

    def _check_index(self) -> None:
        """Rebuild (or, read-only, ignore) a vec0 index that is altered or stale; forget a stale mark
        without an index (banks from before the index was optional)."""
        state = self._index_state()
        if state is None:  # the usual case: no sqlite-vec index, nothing more to read at start-up
            return
        dim = (self.meta("embedder") or {}).get("dim")
        if dim is None:
            return
        exists = self.conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'memory_index'").fetchone() is not None
        if not exists and not self.readonly:
            with self._write():
                self.conn.execute("DELETE FROM meta WHERE key = 'index'")
            return
        if not self.vec.loaded:
            return
        altered = exists and not sqlite_schema.index_matches(self.conn, int(dim))
        if altered:
            self.warnings.append("ignoring the sqlite-vec index: it is not defined as memrl defines it"
                                 + ("" if self.readonly else "; rebuilt it from the stored vectors"))
        if self.readonly:
            self._index_ignored = altered
        elif altered or state == "stale":
            with self._write():
                self.build_index("vec", int(dim))

    def begin(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def has_table(self, name: str) -> bool:
        return self.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                 (name,)).fetchone() is not None

    def backup(self, destination: str, overwrite: bool = False) -> None:
        """SQLite's online backup into a new file (removed again if the copy fails)."""
        if os.path.exists(destination):
            if not overwrite:
                raise MemrlError(f"{destination} exists; pass --force to overwrite it")
            os.remove(destination)
        try:
            target = connect(destination)
            try:
                self.conn.raw.backup(target)
                problems = [row[0] for row in target.execute("PRAGMA quick_check(3)")]
            finally:
                target.close()
        except Error as exc:
            if os.path.exists(destination):
                os.remove(destination)
            raise MemrlError(f"cannot write a backup to {destination}: {exc}") from None
        if problems != ["ok"]:  # the online backup copies pages as they are: a damaged bank gives a damaged copy
            os.remove(destination)
            raise MemrlError(f"{self.path} is damaged, not a valid memrl bank ({problems[0]}); no backup written: "
                             "restore it from an earlier `memrl backup` copy")

    def vacuum(self) -> bool:
        """The WAL emptied into the file, the file rebuilt without free pages (VACUUM), the WAL emptied again;
        False when a reader kept the last checkpoint from copying the WAL whole (its row: busy, frames, copied)."""
        for statement in ("PRAGMA wal_checkpoint(TRUNCATE)", "VACUUM"):
            self.conn.execute(statement).fetchall()
        busy, frames, copied = self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        return busy == 0 and frames == copied

    def index_problems(self, memories: int) -> list[str]:
        info = self.index_info()
        memories -= self.erased_count()  # erased memories have no vector to index
        if info["kind"] == "vec" and info.get("indexed") is not None and info["indexed"] != memories:
            return [f"the sqlite-vec index has {info['indexed']} vectors for {memories} memories with a vector "
                    "(run `memrl doctor --rebuild-index`)"]
        return []

    def rollback(self) -> None:
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    def version(self) -> tuple[int, ...]:
        return int(self.conn.execute("PRAGMA data_version").fetchone()[0]), self.conn.total_changes

    def error(self, exc: BaseException) -> MemrlError:
        message, path = str(exc), self.path
        if "locked" in message or "busy" in message:
            return BankBusyError(f"the bank {path} stayed locked by another writer for "
                                 f"{number(round(self.busy_ms / 1000, 3))} s; try again")
        if "readonly" in message or "read-only" in message:
            return MemrlError(f"cannot write to {path}: the file or its directory is read-only")
        if "disk is full" in message or "disk I/O" in message:
            free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
            hint = f" (only {free // 1024} KB free: is the disk full?)" if free < 64 * 1024 * 1024 else ""
            return MemrlError(f"cannot write to {path}: {message}{hint}; nothing was changed")
        if "not a database" in message or "malformed" in message:
            if not has_sqlite_header(path):
                return MemrlError(f"{path} is not a memrl bank: not a SQLite database (check --db / MEMRL_DB; if "
                                  "it was a bank, its header is damaged: restore it from a `memrl backup` copy)")
            return MemrlError(f"{path} is damaged, not a valid memrl bank ({message}); nothing was changed: "
                              "restore it from a `memrl backup` copy")
        if "unable to open" in message:
            folder = os.path.dirname(os.path.abspath(path))
            if os.path.exists(path) and not os.access(folder, os.W_OK):
                return MemrlError(f"cannot open {path}: its directory is read-only, and SQLite needs to "
                                  "create the bank's -wal and -shm files next to it")
            return MemrlError(f"cannot open {path}: {message}")
        if "UNIQUE constraint failed" in message:
            return MemrlError(f"another process wrote the same rows to {path} at the same time ({message}); "
                              "nothing was changed: run the command again")
        return MemrlError(f"database error on {path}: {message}; nothing was changed")

    def trim_query_cache(self, keep: int) -> None:
        self.conn.execute("DELETE FROM query_cache WHERE rowid <= (SELECT max(rowid) FROM query_cache) - ?", (keep,))

    def encode(self, vector: np.ndarray) -> bytes:
        return vector.astype(np.float32, copy=False).tobytes()

    def decode(self, values: list[Any]) -> np.ndarray:
        return np.frombuffer(b"".join(values), dtype=np.float32).reshape(len(values), -1)

    def schema_version(self) -> int:
        return int(self.conn.execute("PRAGMA user_version").fetchone()[0])

    def integrity(self) -> list[str]:
        return [r[0] for r in self.conn.execute("PRAGMA integrity_check")]

    def bad_vectors(self, dim: int) -> int:
        return int(self.conn.execute("SELECT count(*) FROM memories WHERE length(embedding) != ?",
                                     (4 * dim,)).fetchone()[0])

    def describe(self) -> dict[str, Any]:
        return {"engine": "sqlite", "driver": driver.__name__,
                "sqlite_version": self.conn.execute("SELECT sqlite_version()").fetchone()[0],
                "sqlite_vec": self.vec.loaded, "sqlite_vec_problem": self.vec.reason or None}

    # -- the optional sqlite-vec index: meta `index` is absent (none), "ok", or "stale" ------------

    def _index_state(self) -> str | None:
        return (self.meta("index") or {}).get("state")

    def index_info(self) -> dict[str, Any]:
        state = self._index_state()
        info: dict[str, Any] = {"kind": "vec" if state else "none", "sqlite_vec": self.vec.loaded,
                                "reason": self.vec.reason or None}
        if state:
            info["state"] = state
            if state == "ok":
                info["indexed"] = self.indexed() if self.vec.loaded else None
        return info

    def unindex(self, memory_ids: Sequence[int]) -> None:
        if self.index_ready():
            self.conn.executemany("DELETE FROM memory_index WHERE memory_id = ?", [(mid,) for mid in memory_ids])
        elif memory_ids and self._index_state() == "ok":
            self.set_meta("index", {**(self.meta("index") or {}), "state": "stale"})

    def indexed(self) -> int:
        """Vectors in the sqlite-vec index."""
        return int(self.conn.execute("SELECT count(*) FROM memory_index").fetchone()[0])

    def index_ready(self) -> bool:
        return self.vec.loaded and not self._index_ignored and self._index_state() == "ok"

    def add_to_index(self, rows: list[tuple[int, Any]]) -> None:
        """Index new memories in sqlite-vec; without sqlite-vec, mark its index stale (rebuilt later)."""
        if self.index_ready():
            self.conn.executemany("INSERT INTO memory_index (memory_id, embedding) VALUES (?, ?)", rows)
        elif rows and self._index_state() == "ok":
            self.set_meta("index", {**(self.meta("index") or {}), "state": "stale"})

    def build_index(self, kind: str, dim: int) -> None:
        if kind != "vec":
            raise MemrlError(f"a SQLite bank has no {kind!r} index; use vec (sqlite-vec) or none")
        if not self.vec.loaded:
            raise MemrlError(f"cannot build the sqlite-vec index: {self.vec.reason}")
        self.conn.execute("DROP TABLE IF EXISTS memory_index")
        self.conn.execute(sqlite_schema.index_ddl(dim))
        self.conn.execute(f"INSERT INTO memory_index (memory_id, embedding) SELECT id, embedding FROM memories "
                          f"WHERE NOT {ERASED}")
        self.set_meta("index", {"state": "ok", "dim": dim})
        self._index_ignored = False

    def drop_index(self) -> None:
        if self.conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'memory_index'").fetchone():
            if not self.vec.loaded:
                raise MemrlError(f"cannot drop the sqlite-vec index without sqlite-vec: {self.vec.reason}")
            self.conn.execute("DROP TABLE memory_index")
        self.conn.execute("DELETE FROM meta WHERE key = 'index'")

    def knn(self, vector: np.ndarray, k: int, mode: str, hidden: np.ndarray | None = None,
            filters: Filters = (), threshold: float | None = None,
            vectors: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """sqlite-vec filters by `memory_id IN (…)` before its top k, but not by NOT IN: the hidden
        (few) are fetched in excess and dropped, or excluded by IN when they are too many. No
        vectors (None, whatever `vectors` asks): reading sqlite-vec's copies in the KNN made a grouped
        retrieve at 100k 1.37x slower than the caller's own read of the stored rows."""
        hidden = np.zeros(0, dtype=np.int64) if hidden is None else hidden
        conditions, args = self.filter_condition(filters)
        fetch = k + len(hidden)
        if fetch > KNN_MAX:
            conditions.append(VISIBLE)
            fetch = k
        where = f" AND memory_id IN (SELECT id FROM memories WHERE {' AND '.join(conditions)})" if conditions else ""
        sql = f"SELECT memory_id, distance FROM memory_index WHERE embedding MATCH ? AND k = ?{where}"
        rows = self.conn.execute(sql, (self.encode(vector), fetch, *args)).fetchall()
        # Memories tied with the k-th at the end of the list (within SIM_RESOLUTION): fetch until past the tie, so the
        # caller's tie rule
        # (phase_a: the newest first) chooses among all of them, not sqlite-vec's order.
        while len(rows) == fetch and fetch < KNN_MAX and k <= len(rows) and rows[-1][1] - rows[k - 1][1] < SIM_RESOLUTION:
            fetch = min(2 * fetch, KNN_MAX)
            rows = self.conn.execute(sql, (self.encode(vector), fetch, *args)).fetchall()
        ids = np.array([r[0] for r in rows], dtype=np.int64)
        sims = 1.0 - np.array([r[1] for r in rows], dtype=np.float64)
        keep = np.flatnonzero(~np.isin(ids, hidden))
        if len(keep) > k:  # all the rows tied with the k-th: phase_a keeps k of them, newest first
            keep = keep[sims[keep] >= sims[keep[k - 1]] - SIM_RESOLUTION]
        if threshold is not None:
            keep = keep[sims[keep] >= np.float64(threshold) - SIM_RESOLUTION]
        return ids[keep], sims[keep], None

    def matches(self, column: str, patterns: Sequence[str | None]) -> tuple[str, list[str]]:
        """GLOB, with `[` made literal (`[[]`)."""
        given = [p for p in patterns if p is not None]
        tests = [f"{column} GLOB ?" for _ in given] + [f"{column} IS NULL"] * (None in patterns)
        return "(" + " OR ".join(tests) + ")", [p.replace("[", "[[]") for p in given]

    # -- the bank's `index=` choices (Store) ----------------------------------------------

    def index_problem(self, mode: str) -> str | None:
        if mode == "vec" and not self.vec.loaded:
            return f"index=vec needs sqlite-vec, which is unavailable: {self.vec.reason}"
        return super().index_problem(mode)

    def is_engine_index(self, mode: str) -> bool:
        return mode == "vec"

    def has_index(self, kind: str) -> bool:
        return kind == "vec" and self._index_state() == "ok"

    def unusable_index(self) -> str | None:
        """A recorded sqlite-vec index without sqlite-vec: the bank scans its vectors in process instead."""
        if self.vec.loaded or not self._index_state():
            return None
        return f"the bank's sqlite-vec index is unusable, retrieving by numpy scan: {self.vec.reason}"

    def rebuildable_index(self) -> str | None:
        return "vec" if self._index_state() else None
