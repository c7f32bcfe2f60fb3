"""The PostgreSQL store: a bank shared by agents on many machines, in a database with pgvector.

`memrl --db postgresql://user@host/dbname` (or `MEMRL_DB`) selects it. The tables mirror the
SQLite bank's (docs/schema.md); vectors are pgvector `vector(d)` columns, searched exactly by
default or through an HNSW index (`index="hnsw"`). Writers run concurrently at READ COMMITTED:
every row a write reads and then changes is locked first (`FOR UPDATE`, in id order), so no Q
update is lost and the ledger's order per memory is the order of its updates.

Needs `pip install 'memrl[postgres]'` (psycopg 3 and pgvector's adapter) and a server with the
`vector` extension (pgvector ≥ 0.8; `CREATE EXTENSION vector` needs a superuser once).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from memrl_cli.errors import BankBusyError, MemrlError
from memrl_cli.method.retrieval import SIM_RESOLUTION, Filters
from memrl_cli.store.bank_queries import VISIBLE
from memrl_cli.store.base import POSTGRES_INDEXES, Store, redact
from memrl_cli.store.migrations import CORE, LATEST, check_meta
from memrl_cli.store.postgres_driver import (ADVISORY_LOCK, CHANGES, COPY_TYPES, DROP_GRAPH_SQL, FIRING, GRAPH_INDEX_SQL,
                                             GRAPH_TABLE_SQL, GRAPH_TRIGGER_SQL, HNSW_EF_SEARCH, HNSW_EF_SEARCH_MAX,
                                             MIN_PGVECTOR, REWARD_FIELDS, REWARD_ONE_SQL, REWARD_SQL,
                                             PgConnection, import_driver, pg_sql)


class PostgresStore(Store):
    """A bank in a PostgreSQL database with pgvector; many processes on many machines write to it at once."""

    kind = "postgresql"
    indexes = POSTGRES_INDEXES
    _for_update = " FOR UPDATE"
    _lock_tasks = "LOCK TABLE tasks IN SHARE ROW EXCLUSIVE MODE"  # conflicts with itself and with row writes
    single_statement_writes = True  # autocommit: a statement outside BEGIN is its own transaction
    begin_read = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"

    def __init__(self, url: str, *, readonly: bool = False, create: bool = True,
                 busy_timeout: float | None = None) -> None:
        psycopg, register_vector = import_driver()
        self.errors = (psycopg.Error,)
        self._psycopg = psycopg
        self.location = self.path = redact(url)
        self.readonly = readonly
        self.warnings: list[str] = []
        self._graph: str | None = None  # graph_table(), looked up when needed
        self._seen: tuple[int] | None = None  # the change counter last read (version)
        try:
            raw = psycopg.connect(url, autocommit=True, application_name="memrl",
                                  connect_timeout=10 if busy_timeout is None else max(2, min(10, round(busy_timeout))))
        except psycopg.Error as exc:
            reason = " ".join(line.strip() for line in str(exc).strip().splitlines())  # the cause, then the hint
            raise MemrlError(f"cannot connect to the PostgreSQL bank {self.location}: {reason}") from None
        self.conn = PgConnection(raw)
        try:
            version = self.schema_version()
            if version > LATEST:
                raise MemrlError(f"this bank has schema version {version}, newer than this memrl understands "
                                 f"({LATEST}); upgrade memrl (pip install -U memrl)")
            if version < LATEST:
                if readonly or (version == 0 and not create):
                    raise MemrlError(f"no memrl bank at schema {LATEST} in {self.location}"
                                     + (" (open it writable to migrate)" if version else
                                        " (create one with `memrl ingest`)"))
                self._migrate()
            register_vector(raw)
            if busy_timeout is not None:  # a lock held longer than this fails the statement (BankBusyError)
                raw.execute(f"SET lock_timeout = {max(1, int(busy_timeout * 1000))}")
            if readonly:
                raw.execute("SET default_transaction_read_only = on")
            check_meta(self.conn)
            self.tune_hnsw(int((self.meta("index") or {}).get("ef_search", HNSW_EF_SEARCH)))
        except psycopg.Error as exc:
            raw.close()
            raise self.error(exc) from None
        except BaseException:
            raw.close()
            raise

    def tune_hnsw(self, ef_search: int) -> None:
        """Session settings of HNSW scans (also for an index another process builds later): the
        candidate list (a search for k > ef_search rows sets k for itself: `knn`), and (pgvector
        >= 0.8) iterative scans, so that LIMIT k returns k rows past filters and past 1,000."""
        self.ef_search = ef_search
        self.conn.execute(f"SET hnsw.ef_search = {ef_search}")
        if (self._pgvector() or (0,)) >= (0, 8):
            self.conn.execute("SET hnsw.iterative_scan = relaxed_order")  # the bank re-sorts by similarity

    def _pgvector(self) -> tuple[int, ...] | None:
        row = self.conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
        return tuple(int(p) for p in re.findall(r"\d+", row[0])[:3]) if row else None

    def _migrate(self) -> None:
        """Create the vector extension if needed and run the missing migrations, one process at a time."""
        if self._pgvector() is None:
            available = self.conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone()
            if available is None:
                raise MemrlError(f"the server of {self.location} has no pgvector; install it "
                                 "(https://github.com/pgvector/pgvector) and run CREATE EXTENSION vector")
            try:
                self.conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            except self._psycopg.errors.InsufficientPrivilege:
                raise MemrlError(f"the database of {self.location} lacks the vector extension and this user may "
                                 "not create it; ask an administrator to run CREATE EXTENSION vector there") from None
        found = self._pgvector()
        if found is not None and found[:2] < MIN_PGVECTOR:
            raise MemrlError(f"pgvector {'.'.join(map(str, found))} is too old; memrl needs ≥ 0.5 (0.8 recommended)")
        with self._write():
            self._serialise_schema_changes()
            self.conn.execute("CREATE TABLE IF NOT EXISTS memrl_schema (version INTEGER NOT NULL)")
            row = self.conn.execute("SELECT version FROM memrl_schema").fetchone()
            version = row[0] if row else 0
            for migration in CORE.migrations[version:]:
                for statement in migration.ddl("postgresql"):
                    self.conn.execute(statement)
            if row is None:
                self.conn.execute("INSERT INTO memrl_schema (version) VALUES (?)", (LATEST,))
            else:
                self.conn.execute("UPDATE memrl_schema SET version = ?", (LATEST,))

    def _serialise_schema_changes(self) -> None:
        self.conn.execute("SELECT pg_advisory_xact_lock(?)", (ADVISORY_LOCK,))

    def has_table(self, name: str) -> bool:
        return self.conn.execute("SELECT to_regclass(?)", (name,)).fetchone()[0] is not None

    def begin(self) -> None:
        self.conn.execute("BEGIN")

    def graph_table(self) -> str:
        """The table an HNSW search reads: `memory_vectors` where the graph has its own copy of the vectors, else
        `memories` (a graph an earlier memrl built there, or none: an exact scan). Looked up again after any
        change of the bank (`version`) and after a rollback."""
        if self._graph is None:
            self._graph = "memory_vectors" if self.has_table("memory_vectors") else "memories"
        return self._graph

    def rollback(self) -> None:
        self._graph = None
        if self.conn.raw.info.transaction_status != self._psycopg.pq.TransactionStatus.IDLE:
            self.conn.execute("ROLLBACK")

    def version(self) -> tuple[int]:
        """The change counter: meta and the set of memories as of now (Q values are never cached)."""
        row = self.conn.execute(f"SELECT value FROM meta WHERE key = '{CHANGES}'").fetchone()
        version = (int(row[0]) if row else 0,)
        if version != self._seen:  # another client may have built, moved or dropped the HNSW graph
            self._seen, self._graph = version, None
        return version

    def _changed(self) -> None:
        """Inside a write: bump the change counter, so other processes drop their cached meta and counts."""
        self.conn.execute(f"INSERT INTO meta (key, value) VALUES ('{CHANGES}', '1') ON CONFLICT (key) DO UPDATE "
                          "SET value = (meta.value::int8 + 1)::text")

    def set_meta(self, key: str, value: Any) -> None:
        super().set_meta(key, value)
        self._changed()

    def delete_meta(self, key: str) -> None:
        super().delete_meta(key)
        self._changed()

    def error(self, exc: BaseException) -> MemrlError:
        errors = self._psycopg.errors
        message = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if isinstance(exc, (errors.DeadlockDetected, errors.SerializationFailure, errors.LockNotAvailable)):
            return BankBusyError(f"the PostgreSQL bank {self.location} was busy ({message}); nothing was changed, "
                                 "try again")
        if isinstance(exc, errors.NumericValueOutOfRange):
            return MemrlError("a reward of this size would make Q overflow; use rewards of ordinary size")
        if isinstance(exc, errors.ReadOnlySqlTransaction):
            return MemrlError(f"cannot write to {self.location}: the server is read-only (a replica?); "
                              "send writes to the primary")
        if isinstance(exc, self._psycopg.OperationalError):
            return MemrlError(f"lost the PostgreSQL bank {self.location}: {message}; nothing more was changed")
        return MemrlError(f"database error on {self.location}: {message}")

    def encode(self, vector: np.ndarray) -> np.ndarray:
        return vector.astype(np.float32, copy=False)

    def decode(self, values: list[Any]) -> np.ndarray:
        if not values:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([np.asarray(v.to_numpy() if hasattr(v, "to_numpy") else v, dtype=np.float32)
                         for v in values])

    def insert_memories(self, columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> list[int | None]:
        """Binary COPY into a session table, then one INSERT … SELECT in input order (ids ascend with it)."""
        if len(rows) < 2:
            return super().insert_memories(columns, rows)
        names = ("id", *columns)
        self.conn.execute("CREATE TEMP TABLE IF NOT EXISTS memrl_ingest (LIKE memories) ON COMMIT DELETE ROWS")
        cursor = self.conn.raw.cursor()
        with cursor.copy(f"COPY memrl_ingest ({', '.join(names)}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types([COPY_TYPES.get(name, "text") for name in names])
            for ordinal, row in enumerate(rows):
                copy.write_row((ordinal, *row))
        listed = ", ".join(columns)
        created = {h: int(i) for i, h in self.conn.execute(
            f"INSERT INTO memories ({listed}) SELECT {listed} FROM memrl_ingest ORDER BY id "
            "ON CONFLICT (content_hash) DO NOTHING RETURNING id, content_hash").fetchall()}
        self.conn.execute("TRUNCATE memrl_ingest")  # a later insert in this same transaction starts empty
        at = columns.index("content_hash")
        return [created.pop(row[at], None) for row in rows]  # a repeated hash: its first row only

    def apply_rewards(self, entries: list[tuple[Any, ...]], stamp: str) -> list[tuple[int, float, float]]:
        """One statement (REWARD_ONE_SQL for one memory, else REWARD_SQL with its generic plan); outside a
        transaction it is its own: one round trip."""
        if not entries:
            return []
        raw = self.conn.raw
        if len(entries) == 1:  # a third of the client's CPU of REWARD_SQL's pipeline, 0.7x the server's
            params = dict(zip(REWARD_FIELDS, entries[0]), stamp=stamp)
            rows = raw.execute(REWARD_ONE_SQL, params).fetchall()
        else:  # a custom plan made per call was ~40% of a reward's server time: use the prepared statement's generic
            # one; inside a caller's transaction, back to the server's (or role's) setting after it
            rows = self._with_local_setting("plan_cache_mode = force_generic_plan",
                                            lambda: raw.execute(REWARD_SQL, self._reward_params(entries, stamp)),
                                            restore="plan_cache_mode = DEFAULT")
        if len(rows) < len(entries):
            found = {row[0] for row in rows}
            raise MemrlError(f"unknown memory id {next(e[1] for e in entries if e[1] not in found)}")
        return [(int(m), float(b), float(q)) for m, b, q, _ in rows]

    @staticmethod
    def _reward_params(entries: list[tuple[Any, ...]], stamp: str) -> dict[str, Any]:
        """REWARD_SQL's parameters: a column array per field of the entries."""
        columns = list(zip(*entries))
        return {**{name: list(values) for name, values in zip(REWARD_FIELDS, columns)},
                "n": len(entries), "stamp": stamp}

    def schema_version(self) -> int:
        if self.conn.execute("SELECT to_regclass('memrl_schema')").fetchone()[0] is None:
            return 0
        row = self.conn.execute("SELECT version FROM memrl_schema").fetchone()
        return int(row[0]) if row else 0

    def integrity(self) -> list[str]:
        missing = [t for t in ("memories", "rewards", "retrievals", "meta")
                   if self.conn.execute("SELECT to_regclass(?)", (t,)).fetchone()[0] is None]
        return [f"table {t} is missing" for t in missing] or ["ok"]

    def bad_vectors(self, dim: int) -> int:
        return int(self.conn.execute("SELECT count(*) FROM memories WHERE vector_dims(embedding) != ?",
                                     (dim,)).fetchone()[0])

    def describe(self) -> dict[str, Any]:
        version = self.conn.execute("SHOW server_version").fetchone()[0]
        pgvector = self._pgvector()
        return {"engine": "postgresql", "driver": f"psycopg {self._psycopg.__version__}",
                "server_version": version, "pgvector": ".".join(map(str, pgvector)) if pgvector else None,
                "url": self.location}

    # -- pgvector search: exact (a scan, parallel) or HNSW (approximate) ----------------------

    def matches(self, column: str, patterns: Sequence[str | None]) -> tuple[str, list[str]]:
        """LIKE (case-sensitive in PostgreSQL), with `%`, `_` and `\\` made literal."""
        escaped = [p.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_").replace("*", "%").replace("?", "_")
                   for p in patterns if p is not None]
        tests = [f"{column} LIKE ? ESCAPE '\\'" for _ in escaped] + [f"{column} IS NULL"] * (None in patterns)
        return "(" + " OR ".join(tests) + ")", escaped

    def prepare_vectors(self, dim: int) -> None:
        self.conn.execute(f"ALTER TABLE memories ALTER COLUMN embedding TYPE vector({int(dim)})")
        # Keep vectors in the row: out of line (pgvector's default past ~2 KB rows), every distance of an
        # exact search costs a lookup in the TOAST table (4x slower at 100k memories).
        self.conn.execute("ALTER TABLE memories ALTER COLUMN embedding SET STORAGE MAIN")

    def index_info(self) -> dict[str, Any]:
        recorded = self.meta("index") or {}
        return {"kind": recorded.get("kind", "exact"), **{k: v for k, v in recorded.items() if k != "kind"}}

    def index_ready(self) -> bool:
        return True

    def add_to_index(self, rows: list[tuple[int, Any]]) -> None:
        """The memories table is its own index: new memories only bump the change counter (counts)."""
        if rows:
            self._changed()

    def build_index(self, kind: str, dim: int) -> None:
        if kind != "hnsw":
            raise MemrlError(f"a PostgreSQL bank's optional index is hnsw, not {kind!r}")
        self.conn.execute("SET LOCAL maintenance_work_mem = '1GB'")  # the graph is ~2 KB per 384-d vector
        self._serialise_schema_changes()
        for statement in GRAPH_TABLE_SQL:
            self.conn.execute(statement.format(dim=int(dim)))
        trigger = self._copy_trigger()
        if trigger is None:  # (not DROP and CREATE: dropping a trigger would lock out reads until the end)
            self.conn.execute(GRAPH_TRIGGER_SQL)
        elif trigger not in FIRING:
            self.conn.execute("ALTER TABLE memories ENABLE TRIGGER memories_copy_vectors")
        for statement in GRAPH_INDEX_SQL:
            self.conn.execute(statement)
        self._graph = None
        self.set_meta("index", {"kind": "hnsw", "ef_search": HNSW_EF_SEARCH, "dim": dim})
        self.tune_hnsw(HNSW_EF_SEARCH)

    def _copy_trigger(self) -> str | None:
        """The state of the trigger that fills `memory_vectors` (pg_trigger.tgenabled), None without it."""
        row = self.conn.execute("SELECT tgenabled FROM pg_trigger WHERE tgname = 'memories_copy_vectors' "
                                "AND tgrelid = 'memories'::regclass").fetchone()
        return None if row is None else str(row[0])

    def index_problems(self, memories: int) -> list[str]:
        """The HNSW graph's copy of the vectors: its trigger in place and firing, a row for every memory."""
        if not self.has_table("memory_vectors"):
            return []
        problems = []
        if self._copy_trigger() not in FIRING:
            problems.append("the trigger that copies new memories' vectors for the HNSW index is missing or disabled")
        copied = int(self.conn.execute("SELECT count(*) FROM memory_vectors").fetchone()[0])
        memories -= self.erased_count()  # erased memories have no vector to index
        if copied != memories:
            problems.append(f"the HNSW index's copy of the vectors has {copied} for {memories} memories with a vector")
        return [f"{problem} (run `memrl doctor --index hnsw`)" for problem in problems]

    def vacuum(self) -> bool:
        """VACUUM FULL of the tables that hold memories' texts and vectors: rewritten without dead rows (it
        waits for the other sessions' locks, so it is whole when it returns)."""
        for table in ("memories", "memory_vectors") if self.has_table("memory_vectors") else ("memories",):
            self.conn.execute(f"VACUUM FULL {table}")
        return True

    def unindex(self, memory_ids: Sequence[int]) -> None:
        if memory_ids and self.has_table("memory_vectors"):
            self.conn.execute("DELETE FROM memory_vectors WHERE id = ANY(?)", (list(memory_ids),))

    def drop_index(self) -> None:
        self._serialise_schema_changes()
        for statement in DROP_GRAPH_SQL:
            self.conn.execute(statement)
        self._graph = None
        self.delete_meta("index")

    def knn(self, vector: np.ndarray, k: int, mode: str, hidden: np.ndarray | None = None,
            filters: Filters = (), threshold: float | None = None,
            vectors: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """`mode` exact adds 0 to the distance, which the HNSW index cannot serve: a scan, always exact.
        Filters are a WHERE clause (HNSW: pgvector ≥ 0.8's iterative scan keeps filling the k). The
        rows below `threshold` (and their vectors) stay on the server; results are read in binary."""
        hnsw = mode == "hnsw" or (mode == "auto" and self.index_info()["kind"] == "hnsw")
        distance = "v.embedding <=> ?" if hnsw else "(v.embedding <=> ?) + 0"
        conditions: list[str] = [VISIBLE] if hidden is not None and len(hidden) else []
        more, patterns = self.filter_condition(filters)
        conditions += more
        args: list[Any] = list(patterns)
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        rows_from = "memories v"  # filters name columns of the memory row, which only `memories` has
        if hnsw and self.graph_table() == "memory_vectors":
            rows_from = "memory_vectors v" + (" JOIN memories USING (id)" if conditions else "")
        order = "d" if hnsw else "d, id DESC"  # exact: ties to the newest memory, as phase_a (HNSW: the graph's order)
        knn = f"SELECT id, {distance} AS d{', v.embedding' if vectors else ''} FROM {rows_from}{where} ORDER BY {order} LIMIT ?"
        sql, args = knn, [self.encode(vector), *args]
        if threshold is not None:  # a margin over float rounding: the exact cut is made below, as phase_a makes it
            sql = f"SELECT * FROM ({knn}) AS nearest WHERE d <= ?"
        fetch = k + 1  # one past the k-th: whether it ties with the k-th
        rows = self._nearest(sql, args, fetch, threshold, hnsw)
        # Memories tied with the k-th (within SIM_RESOLUTION; exact ties come newest first): fetch until past the tie,
        # so the caller's tie rule (phase_a: the newest first) chooses among all of them, not the engine's order.
        while len(rows) == fetch and rows[-1][1] - rows[k - 1][1] < SIM_RESOLUTION:
            fetch *= 2
            rows = self._nearest(sql, args, fetch, threshold, hnsw)
        ids = np.array([r[0] for r in rows], dtype=np.int64)
        sims = 1.0 - np.array([r[1] for r in rows], dtype=np.float64)
        floor = sims[k - 1] - SIM_RESOLUTION if len(sims) > k else -np.inf  # the k nearest and those tied with the k-th
        if threshold is not None:
            floor = max(floor, np.float64(threshold) - SIM_RESOLUTION)
        keep = np.flatnonzero(sims >= floor)
        found = self.decode([r[2] for r in rows])[keep] if vectors else None
        return ids[keep], sims[keep], found

    def _nearest(self, sql: str, args: list[Any], k: int, threshold: float | None, hnsw: bool) -> list[tuple[Any, ...]]:
        """The rows of `knn`'s statement for `k` (and, with `threshold`, its cut with a margin over rounding: the exact
        cut is made by the caller, as phase_a makes it)."""
        args = [*args, k] + ([1.0 - threshold + 2 * SIM_RESOLUTION] if threshold is not None else [])
        if hnsw and k > self.ef_search:  # a list of k, not the iterative scan past ef_search (2x slower)
            cursor = self.conn.raw.cursor(binary=True)
            return self._with_local_setting(f"hnsw.ef_search = {int(min(k, HNSW_EF_SEARCH_MAX))}",
                                            lambda: cursor.execute(pg_sql(sql), args), begin="BEGIN READ ONLY",
                                            restore=f"hnsw.ef_search = {int(self.ef_search)}")
        return self.conn.execute(sql, args).fetchall()

    def _with_local_setting(self, setting: str, run: Callable[[], Any], *, begin: str = "BEGIN",
                            restore: str | None = None) -> list[tuple[Any, ...]]:
        """The rows of the cursor `run()` returns, run with `SET LOCAL setting` for it alone, all in one round
        trip (a pipeline): outside a transaction in its own (`begin` … COMMIT), inside the caller's followed
        by `SET LOCAL restore`."""
        raw = self.conn.raw
        outside = raw.info.transaction_status == self._psycopg.pq.TransactionStatus.IDLE
        try:
            with raw.pipeline():
                if outside:
                    raw.execute(begin)
                raw.execute(f"SET LOCAL {setting}")
                cursor = run()
                if outside or restore:
                    raw.execute("COMMIT" if outside else f"SET LOCAL {restore}")
        except BaseException:
            if outside:
                self.rollback()
            raise
        return cursor.fetchall()

    # -- the bank's `index=` choices (Store) ----------------------------------------------

    def is_engine_index(self, mode: str) -> bool:
        return mode == "hnsw"
