"""Where a bank lives: a SQLite file (the default) or a PostgreSQL database with pgvector.

`MemoryBank` holds the method (retrieval scoring, the Q rule, receipts, the ledger,
calibration) once; a `Store` is everything that differs between the two engines: opening
and migrating, transactions, the change token behind the bank's caches, how a vector is
written and read, the server-side nearest-neighbour search, and how driver errors read.

SQL shared by both is written once, in the common dialect of SQLite ≥ 3.35 and PostgreSQL:
`?` placeholders (translated for psycopg), `INSERT … ON CONFLICT`, `RETURNING id`. Rows a
write reads before changing them are locked first (`lock_rows`, `rows_by_id(..., lock=True)`:
`FOR UPDATE` on PostgreSQL, where writers run concurrently; nothing on SQLite, where
`BEGIN IMMEDIATE` already serialises them).

Nothing outside the Store runs SQL on a bank: the operations over a bank use the named queries
of `store_views` (reads), `store_repairs` (hygiene and transfer writes) and `store_runs` (the
harness's tables), which `Store` mixes in.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from memrl_cli.errors import MemrlError
from memrl_cli.method.learning import q_update
from memrl_cli.method.retrieval import FILTER_COLUMNS, Filters
from memrl_cli.store.bank_queries import BankQueries
from memrl_cli.store.migrations import MigrationSet
from memrl_cli.store.repairs import BankRepairs
from memrl_cli.store.runs import RunRecords
from memrl_cli.store.views import CHUNK, BankViews

SERVER_SCHEMES = ("postgresql://", "postgres://")
# Where a memory row is one retrieval may return: neither quarantined (`hygiene`) nor forgotten (`memories`).


def is_server_url(location: str) -> bool:
    """Whether a bank location names a PostgreSQL server rather than a SQLite file."""
    return location.startswith(SERVER_SCHEMES)


def redact(url: str) -> str:
    """A bank location without a server password (in the user part or a `password=` parameter),
    for messages and `bank.path`."""
    if not is_server_url(url):
        return url
    parts = urlsplit(url)
    if parts.password is not None:
        parts = parts._replace(netloc=f"{parts.username or ''}:***@{parts.netloc.rpartition('@')[2]}")
    query = "&".join("password=***" if pair.lower().startswith("password=") else pair
                     for pair in parts.query.split("&")) if parts.query else ""
    return urlunsplit(parts._replace(query=query))


class Store(BankQueries, BankViews, BankRepairs, RunRecords):
    """The engine under a bank. Subclasses: `memrl_cli.store.sqlite.SqliteStore`, `memrl_cli.store.postgres.PostgresStore`."""

    kind: str
    location: str  # for messages: a file path, or a server URL without its password
    conn: Any  # DB-API connection-like: execute(sql, args) and executemany(sql, rows) with `?` placeholders
    _for_update = ""  # appended to a SELECT of rows the current write will change (`lock_rows`)
    single_statement_writes = False  # whether `apply_rewards` is atomic on its own, outside a transaction
    begin_read = "BEGIN"  # a read-only transaction on one state of the bank (SQLite: its WAL snapshot)
    indexes: tuple[str, ...]  # the `index=` choices this engine offers
    errors: tuple[type[BaseException], ...]  # driver exceptions that `error()` turns into MemrlError
    warnings: list[str]

    def lock_rows(self, table: str, ids: Iterable[int]) -> None:
        """Inside a write: lock rows this transaction reads and then changes, in id order (so writers
        never deadlock); a no-op on SQLite, whose writers are already serialised."""
        if self._for_update:
            self.rows_by_id(table, "id", ids, lock=True)

    def rows_by_id(self, table: str, columns: str, ids: Iterable[int], lock: bool = False) -> list[tuple]:
        """`columns` of the rows of `table` whose id is in `ids`, by id (in chunks); with `lock`, locked
        for the current write (`lock_rows`)."""
        ordered, rows = sorted(ids), []
        suffix = self._for_update if lock else ""
        for start in range(0, len(ordered), CHUNK):
            chunk = ordered[start:start + CHUNK]
            rows += self.conn.execute(f"SELECT {columns} FROM {table} WHERE id IN ({','.join('?' * len(chunk))}) "
                                      f"ORDER BY id{suffix}", chunk).fetchall()
        return rows

    def begin(self) -> None:
        """Start a write transaction."""
        raise NotImplementedError

    def commit(self) -> None:
        """Commit the write transaction."""
        self.conn.execute("COMMIT")

    def rollback(self) -> None:
        """Roll back the write transaction, if one is open."""
        raise NotImplementedError

    @contextmanager
    def _write(self) -> Iterator[None]:
        """A write transaction of the store's own (opening checks), without the bank's error mapping."""
        self.begin()
        try:
            yield
            self.commit()
        except BaseException:
            self.rollback()
            raise

    @contextmanager
    def savepoint(self, name: str) -> Iterator[None]:
        """Inside a write: a nested transaction. An exception rolls back only the writes made inside
        it and propagates; the enclosing transaction stays open and usable (on PostgreSQL too, where a
        failed statement would otherwise abort it)."""
        self.conn.execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            try:
                self.conn.execute(f"ROLLBACK TO SAVEPOINT {name}")
                self.conn.execute(f"RELEASE SAVEPOINT {name}")
            except self.errors + (MemrlError,):  # the connection itself is gone: the enclosing transaction fails too
                pass
            raise
        self.conn.execute(f"RELEASE SAVEPOINT {name}")

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """A read transaction: every read inside it sees the bank at one moment while others write."""
        self.conn.execute(self.begin_read)
        try:
            yield
        finally:
            self.rollback()

    def version(self) -> tuple[int, ...] | None:
        """A token that changes whenever the bank may have changed; None when the engine has none
        (then the bank caches nothing)."""
        raise NotImplementedError

    def error(self, exc: BaseException) -> MemrlError:
        """A one-line, actionable error for a driver exception."""
        raise NotImplementedError

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    # -- values -----------------------------------------------------------------

    def encode(self, vector: np.ndarray) -> Any:
        """A unit float32 vector as the engine stores it."""
        raise NotImplementedError

    def decode(self, values: list[Any]) -> np.ndarray:
        """Stored vectors as one float32 matrix (a row each)."""
        raise NotImplementedError

    def meta(self, key: str) -> Any:
        """A value from the meta table (JSON-decoded), or None."""
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def set_meta(self, key: str, value: Any) -> None:
        """Store a meta value (inside the caller's transaction)."""
        self.conn.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET "
                          "value = excluded.value", (key, json.dumps(value)))

    def delete_meta(self, key: str) -> None:
        """Remove a meta value (inside the caller's transaction)."""
        self.conn.execute("DELETE FROM meta WHERE key = ?", (key,))

    def insert(self, sql: str, args: tuple[Any, ...]) -> int | None:
        """Run an INSERT and return the new row's id (None when ON CONFLICT DO NOTHING skipped it)."""
        row = self.conn.execute(sql + " RETURNING id", args).fetchone()
        return None if row is None else int(row[0])

    def insert_memories(self, columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> list[int | None]:
        """Inside a write: insert memories (values in `columns` order, `content_hash` among them); the
        new ids in input order, None where the content is already stored (earlier, or earlier in `rows`)."""
        sql = (f"INSERT INTO memories ({', '.join(columns)}) VALUES ({','.join('?' * len(columns))}) "
               "ON CONFLICT (content_hash) DO NOTHING")
        return [self.insert(sql, row) for row in rows]

    def apply_rewards(self, entries: list[tuple[Any, ...]], stamp: str) -> list[tuple[int, float, float]]:
        """Inside a write (or alone where `single_statement_writes`): apply the Q rule once to each
        (retrieval_id, memory_id, reward, alpha, floor, source), memory ids distinct, and append the
        ledger rows in that order; [(memory_id, q_before, q_after)]. An unknown memory id changes
        nothing and raises."""
        ordered = sorted({e[1] for e in entries})
        q: dict[int, float] = dict(self.rows_by_id("memories", "id, q", ordered))  # one read per chunk, in id order
        missing = next((e[1] for e in entries if e[1] not in q), None)
        if missing is not None:
            raise MemrlError(f"unknown memory id {missing}")
        applied = []
        for rid, mid, r, a, f, source in entries:
            q_before = float(q[mid])
            applied.append((mid, q_before, q_update(q_before, r, a, f)))
        after = {mid: q_after for mid, _, q_after in applied}
        self.conn.executemany("UPDATE memories SET q = ?, visits = visits + 1, updated_at = ? WHERE id = ?",
                              [(after[mid], stamp, mid) for mid in ordered])
        self.conn.executemany("INSERT INTO rewards (retrieval_id, memory_id, kind, reward, alpha, q_floor, q_before, "
                              "q_after, created_at, source) VALUES (?,?,?,?,?,?,?,?,?,?)",
                              [(rid, mid, "reward", r, a, f, q_before, q_after, stamp, source)
                               for (rid, mid, r, a, f, source), (_, q_before, q_after) in zip(entries, applied)])
        return applied

    def trim_query_cache(self, keep: int) -> None:
        """Inside a write: keep only the `keep` most recently added query embeddings."""
        self.conn.execute("DELETE FROM query_cache WHERE created_at < (SELECT created_at FROM query_cache "
                          "ORDER BY created_at DESC LIMIT 1 OFFSET ?)", (keep - 1,))

    # -- schema and health ------------------------------------------------------

    def schema_version(self) -> int:
        """The bank's schema version."""
        raise NotImplementedError

    def has_table(self, name: str) -> bool:
        """Whether the bank has this table."""
        raise NotImplementedError

    def migrated_to(self, migrations: MigrationSet) -> int:
        """The version of a set of migrations (`schema.RUNS`) this bank is at; 0 when it has none."""
        version = self.meta(migrations.meta_key or "")
        if version is None and migrations.adopts and self.has_table(migrations.adopts[0]):
            return migrations.adopts[1]  # tables an older memrl's core migrations created
        return int(version or 0)

    def migrate_set(self, migrations: MigrationSet) -> None:
        """Inside a write: bring a set of migrations with a meta version (`schema.RUNS`) to its latest
        version, each step in this engine's DDL, one process at a time."""
        assert migrations.meta_key, "the core set is migrated when the store opens"
        self._serialise_schema_changes()
        version = self.migrated_to(migrations)
        if version > migrations.latest:
            raise MemrlError(f"this bank's {migrations.name} tables have schema version {version}, newer than this "
                             f"memrl understands ({migrations.latest}); upgrade memrl (pip install -U memrl)")
        for migration in migrations.migrations[version:]:
            for statement in migration.ddl(self.kind):
                self.conn.execute(statement)
        if self.meta(migrations.meta_key) != migrations.latest:
            self.set_meta(migrations.meta_key, migrations.latest)

    def _serialise_schema_changes(self) -> None:
        """Inside a write: wait for any other process migrating this bank or changing its engine index
        (SQLite's writers already queue)."""

    def backup(self, destination: str, overwrite: bool = False) -> None:
        """A consistent copy of the bank in a new file `destination` (replacing one only with `overwrite`)
        while others may be writing."""
        raise MemrlError("`memrl backup` copies a SQLite bank; back up a PostgreSQL bank with pg_dump, or move its "
                         "memories, Q values and ledgers with `memrl export --vectors`")

    def vacuum(self) -> bool:
        """Compact the bank so that its files no longer hold erased or deleted bytes (outside a transaction);
        False when another connection's reading kept some of them (try again when the bank is quiet)."""
        raise NotImplementedError

    def index_problems(self, memories: int) -> list[str]:
        """What is wrong with the engine's index of a bank of `memories` memories (`inspect --verify`)."""
        return []

    def integrity(self) -> list[str]:
        """The engine's own consistency check: ["ok"] or problems."""
        raise NotImplementedError

    def bad_vectors(self, dim: int) -> int:
        """How many memories lack a vector of dimension `dim`."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """Engine, driver and version facts for `memrl doctor`."""
        raise NotImplementedError

    # -- the engine's nearest-neighbour index ------------------------------------

    def prepare_vectors(self, dim: int) -> None:
        """Inside the first write: fix the vector dimension (the bank's embedder is now known)."""

    def index_info(self) -> dict[str, Any]:
        """What the engine's index is and whether it is usable, for `inspect --stats`."""
        raise NotImplementedError

    def index_ready(self) -> bool:
        """Whether `knn` can answer (else the bank scans an in-process matrix)."""
        raise NotImplementedError

    def add_to_index(self, rows: list[tuple[int, Any]]) -> None:
        """Inside a write: index new memories, (id, encoded vector) each (engines that index the
        memories table itself do nothing)."""

    def build_index(self, kind: str, dim: int) -> None:
        """Inside a write: create (or rebuild) the engine's index of the given kind."""
        raise NotImplementedError

    def drop_index(self) -> None:
        """Inside a write: drop the engine's optional index."""
        raise NotImplementedError

    def knn(self, vector: np.ndarray, k: int, mode: str, hidden: np.ndarray | None = None,
            filters: Filters = (), threshold: float | None = None,
            vectors: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(ids, cosine similarities, stored vectors) of the k nearest memories, best first, searched
        by the engine; never the `hidden` ids (the quarantined and forgotten memories), with `filters`,
        only memories that match each (`filter_condition`), and with `threshold`, only those of the
        k whose similarity is at least that. The vectors (a float32 row each) are read in the same
        query when `vectors` asks for them and the engine reads them cheaply there, else None (the
        caller reads them)."""
        raise NotImplementedError

    def matches(self, column: str, patterns: Sequence[str | None]) -> tuple[str, list[str]]:
        """An SQL condition (and its arguments) true where the text `column` matches one of the
        shell-style `patterns`: `*` any text, `?` one character, anything else itself, case-sensitive,
        the whole value; NULL matches only the pattern None (no value)."""
        raise NotImplementedError

    def filter_condition(self, filters: Filters) -> tuple[list[str], list[str]]:
        """The SQL conditions (and their arguments) of retrieval's `filters`: per (column, patterns)
        with patterns, `matches` of that column (source, scope)."""
        conditions: list[str] = []
        args: list[str] = []
        for column, patterns in filters:
            if patterns:
                if column not in FILTER_COLUMNS:
                    raise ValueError(f"not a filter column: {column!r}")
                condition, more = self.matches(column, patterns)
                conditions.append(condition)
                args += more
        return conditions, args

    # -- the bank's `index=` choices, as the engine answers them -------------------

    def index_problem(self, mode: str) -> str | None:
        """Why a bank on this engine cannot search with `index=mode`, or None when it can."""
        if mode not in self.indexes:
            return f"index={mode} is not available for a {self.kind} bank; use one of {', '.join(self.indexes)}"
        return None

    def is_engine_index(self, mode: str) -> bool:
        """Whether `index=mode` names the engine's optional index (which the bank builds when it lacks it)."""
        return False

    def has_index(self, kind: str) -> bool:
        """Whether the bank has the engine's optional index `kind`, ready to use."""
        return bool(self.index_info()["kind"] == kind)

    def unusable_index(self) -> str | None:
        """Why the engine index the bank records cannot serve searches here (a warning the bank shows
        once), or None: usable, or none recorded."""
        return None

    def rebuildable_index(self) -> str | None:
        """The kind of the bank's optional index that `MemoryBank.rebuild_index` refreshes, if it has one."""
        return None

    def change_index(self, kind: str, dim: int | None) -> None:
        """Inside a write: build the optional index `kind` for vectors of dimension `dim`, or drop it
        (`none`, `exact`); `kind` passed `check_index_change`."""
        if kind in ("none", "exact"):
            self.drop_index()
        elif dim is None:
            raise MemrlError("the bank is empty: ingest a memory first, then build the index")
        else:
            self.build_index(kind, dim)


def open_store(location: str, *, readonly: bool = False, create: bool = True,
               busy_timeout: float | None = None) -> Store:
    """The store for a bank location: a PostgreSQL URL, else a SQLite file path. `busy_timeout`: how many
    seconds a statement waits for another writer's lock before failing with BankBusyError (default: 30 on
    SQLite, the server's lock_timeout on PostgreSQL)."""
    if is_server_url(location):
        from memrl_cli.store.postgres import PostgresStore

        return PostgresStore(location, readonly=readonly, create=create, busy_timeout=busy_timeout)
    from memrl_cli.store.sqlite import SqliteStore

    return SqliteStore(location, readonly=readonly, create=create, busy_timeout=busy_timeout)


SQLITE_INDEXES = ("auto", "numpy", "bit", "vec")  # `SqliteStore.indexes`
POSTGRES_INDEXES = ("auto", "exact", "hnsw")  # `PostgresStore.indexes`
INDEX_NAMES = tuple(dict.fromkeys(SQLITE_INDEXES + POSTGRES_INDEXES))  # every engine's: a bank refuses any other




def check_index_change(kind: str) -> None:
    """Refuse an index change no engine offers: build vec (SQLite) or hnsw (PostgreSQL), drop with none or exact."""
    if kind not in ("vec", "hnsw", "none", "exact"):
        raise MemrlError(f"index must be vec or none (SQLite), hnsw or exact (PostgreSQL), got {kind!r}")
