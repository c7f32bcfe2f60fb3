"""A bank's connection: write transactions (nested ones as savepoints), read snapshots, and values
cached until the bank changes; the one object every part of `MemoryBank` writes and reads through.

Values read on every retrieve (meta, counts, the in-process matrix) are cached and re-read only
after a write: this connection's (counted in `writes`), or another's (the Store's change token:
SQLite's `PRAGMA data_version`; on PostgreSQL a change counter in meta), read once per call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from memrl_cli.errors import MemrlError
from memrl_cli.store.base import Store



class BankConnection:
    """Transactions, snapshots and caches over one Store (one per `MemoryBank`)."""

    def __init__(self, store: Store, readonly: bool = False) -> None:
        self.store = store
        self.conn = store.conn
        self.path = store.location
        self.readonly = readonly
        self.depth = 0  # open transactions: 0 outside a write, 1 in one, more in its savepoints
        self.writes = 0  # transactions this object ended: part of the cache version
        self.cache: dict[str, Any] = {}
        self._cache_version: tuple[int, ...] | None = None
        self._pinned: tuple[int, ...] | None = None  # the change token read once for the current call

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """One atomic write (SQLite: `BEGIN IMMEDIATE` … `COMMIT`), rolled back on any error.

        Nested calls are savepoints inside the outer transaction, so a caller can make several bank
        operations (rewards, new memories, run records) one atomic step; an inner block that fails
        rolls back its own writes only, and a caller that catches its error can go on and commit.
        """
        if self.readonly:
            raise MemrlError(f"{self.path} was opened read-only")
        if self.depth:
            self.depth += 1
            try:
                with self.store.savepoint(f"memrl_nested_{self.depth}"):
                    yield self.conn
            except self.store.errors as exc:
                raise self.store.error(exc) from None
            finally:
                self.depth -= 1
            return
        try:
            self.store.begin()
        except self.store.errors as exc:
            raise self.store.error(exc) from None
        self.depth = 1
        try:
            yield self.conn
            self.depth = 0
            self.store.commit()
        except self.store.errors as exc:
            self.depth = 0
            self._rollback()
            raise self.store.error(exc) from None
        except BaseException:
            self.depth = 0
            self._rollback()
            raise
        finally:
            self.writes += 1

    def single_statement(self, write: Callable[[], Any]) -> Any:
        """A write that is one statement, its own transaction on the server (all or nothing)."""
        if self.readonly:
            raise MemrlError(f"{self.path} was opened read-only")
        try:
            return write()
        except self.store.errors as exc:
            raise self.store.error(exc) from None
        finally:
            self.writes += 1

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Reads that all see the bank at one moment while other processes write (export, verify);
        inside a write transaction, that transaction's own view."""
        if self.depth:
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
        except self.store.errors + (MemrlError,):  # the connection itself is gone: the server rolled back
            pass

    # -- caches -----------------------------------------------------------------

    def version(self) -> tuple[int, ...] | None:
        """Changes since the caches were filled (commits by other connections, writes by this one);
        None when the engine cannot tell."""
        if self._pinned is not None:
            return self._pinned
        version = self.store.version()
        return None if version is None else (*version, self.writes)

    @contextmanager
    def one_version(self) -> Iterator[None]:
        """Read the change token once for a whole call, however many cached values it uses."""
        if self._pinned is not None or self.depth:
            yield
            return
        self._pinned = self.version()
        try:
            yield
        finally:
            self._pinned = None

    def cached(self, key: str, compute: Callable[[], Any]) -> Any:
        """`compute()`, cached until the bank changes (always fresh inside a write transaction)."""
        if self.depth:
            return compute()
        version = self.version()
        if version is None:
            return compute()
        if version != self._cache_version:
            self.cache.clear()
            self._cache_version = version
        if key not in self.cache:
            self.cache[key] = compute()
        return self.cache[key]

    # -- reads every part of the bank uses ---------------------------------------

    def meta(self, key: str) -> Any:
        """A value from the meta table (JSON-decoded), or None."""
        return self.store.meta(key)

    def has_memories(self) -> bool:
        """Whether the bank holds a memory (cheaper than `count()` where nothing is cached)."""
        return self.cached("any", self.store.has_memory)

    def count(self) -> int:
        """Number of memories."""
        return self.cached("count", self.store.memory_count)

    def by_ids(self, columns: str, table: str, ids: Iterable[int]) -> list[tuple]:
        """`columns` of the rows of `table` whose id is in `ids`, by id (`Store.rows_by_id`)."""
        return self.store.rows_by_id(table, columns, ids)

    def lock(self, table: str, ids: set[int]) -> None:
        """Inside a write: lock rows this transaction reads and then changes (`Store.lock_rows`)."""
        self.store.lock_rows(table, ids)
