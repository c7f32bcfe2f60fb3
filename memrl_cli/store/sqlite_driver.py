"""The SQLite driver of a bank file: which `sqlite3` module, the sqlite-vec extension, connection
settings, the driver's errors mapped to one-line errors on every statement (`MappedConnection`), and
the atomic creation of a new bank file.

The system Python on many machines (pyenv builds, macOS) cannot load SQLite extensions.
We use `pysqlite3` (from `pysqlite3-binary`) when it is installed, else the standard
library's `sqlite3` if it can load extensions, else the standard library without the
extension: the bank then still opens and retrieves by a numpy scan over the raw vectors.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any


from memrl_cli.store import sqlite_schema
from memrl_cli.errors import MemrlError

try:  # pysqlite3-binary: a modern SQLite that can load extensions on Linux x86_64
    from pysqlite3 import dbapi2 as sqlite3  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the platform
    import sqlite3  # type: ignore[no-redef]

driver: ModuleType = sqlite3
Error = sqlite3.Error
OperationalError = sqlite3.OperationalError
DatabaseError = sqlite3.DatabaseError
IntegrityError = sqlite3.IntegrityError

BUSY_TIMEOUT_MS = 30_000


def has_sqlite_header(path: str) -> bool:
    """Whether the file starts like every SQLite database (or cannot be read to tell)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(16) == b"SQLite format 3\x00"
    except OSError:
        return True


@dataclass(frozen=True)
class VecStatus:
    """Whether sqlite-vec is loaded on a connection, and if not, why."""

    loaded: bool
    reason: str = ""


def _vec_library_path() -> str | None:
    """Path of sqlite-vec's loadable library, found without importing the package."""
    spec = importlib.util.find_spec("sqlite_vec")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = list(spec.submodule_search_locations)[0]
    for name in ("vec0.so", "vec0.dylib", "vec0.dll"):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            return path
    return None


def load_vec(conn: Any) -> VecStatus:
    """Load sqlite-vec into `conn`; report why not when it cannot be loaded."""
    if os.environ.get("MEMRL_DISABLE_VEC") == "1":
        return VecStatus(False, "disabled by MEMRL_DISABLE_VEC=1")
    if not hasattr(conn, "enable_load_extension"):
        return VecStatus(
            False,
            f"this Python's {driver.__name__} cannot load SQLite extensions "
            "(install pysqlite3-binary on Linux x86_64, or use a Python built with "
            "--enable-loadable-sqlite-extensions)",
        )
    path = _vec_library_path()
    if path is None:
        return VecStatus(False, "the sqlite-vec package is not installed (pip install sqlite-vec)")
    try:
        conn.enable_load_extension(True)
        conn.load_extension(path[: path.rfind(".")])
    except Error as exc:
        return VecStatus(False, f"sqlite-vec failed to load: {exc}")
    finally:
        conn.enable_load_extension(False)
    return VecStatus(True)


def connect(path: str, *, readonly: bool = False, busy_ms: int = BUSY_TIMEOUT_MS) -> Any:
    """A connection with the bank's settings: WAL, busy timeout (`busy_ms`), foreign keys, no untrusted SQL.

    Transactions are explicit (`isolation_level=None`): the bank opens `BEGIN IMMEDIATE`
    for every write so that concurrent writers queue on the busy timeout instead of failing.
    """
    uri = f"file:{path}?mode=ro" if readonly else f"file:{path}"
    conn = driver.connect(uri, uri=True, isolation_level=None, timeout=busy_ms / 1000,
                          check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {int(busy_ms)}")
    # A bank from another machine may carry views or triggers with functions in them:
    # never run SQL functions from the schema with side effects.
    conn.execute("PRAGMA trusted_schema = OFF")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


class MappedCursor:
    """A cursor whose driver errors (a damaged page is found while rows are read) become MemrlError."""

    __slots__ = ("_cursor", "_map")

    def __init__(self, cursor: Any, mapper: Callable[[BaseException], MemrlError]) -> None:
        self._cursor, self._map = cursor, mapper

    def fetchone(self) -> Any:
        try:
            return self._cursor.fetchone()
        except Error as exc:
            raise self._map(exc) from None

    def fetchall(self) -> list[Any]:
        try:
            return self._cursor.fetchall()
        except Error as exc:
            raise self._map(exc) from None

    def fetchmany(self, size: int = 1) -> list[Any]:
        try:
            return self._cursor.fetchmany(size)
        except Error as exc:
            raise self._map(exc) from None

    def __iter__(self) -> Iterator[Any]:
        while True:
            rows = self.fetchmany(256)
            if not rows:
                return
            yield from rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class MappedConnection:
    """The bank's connection, whose driver errors become one-line `MemrlError`s (`SqliteStore.error`):
    whatever part of memrl reads a damaged page, a user gets what to do, never the driver's exception."""

    __slots__ = ("raw", "_map")

    def __init__(self, conn: Any, mapper: Callable[[BaseException], MemrlError]) -> None:
        self.raw, self._map = conn, mapper

    def execute(self, sql: str, args: Sequence[Any] = ()) -> MappedCursor:
        try:
            return MappedCursor(self.raw.execute(sql, args), self._map)
        except Error as exc:
            raise self._map(exc) from None

    def executemany(self, sql: str, rows: Any) -> MappedCursor:
        try:
            return MappedCursor(self.raw.executemany(sql, rows), self._map)
        except Error as exc:
            raise self._map(exc) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def scratch() -> Any:
    """A throwaway in-memory database of the same driver (the schema check's reference definitions)."""
    return driver.connect(":memory:", isolation_level=None)


PAGE_SIZE = 16_384  # a memory (~1.5 KB vector + text) fits several per page; at 4 KB each took a whole page
NEW_BANK_RULE = "memrl makes a new bank only where no file exists"


def refuse_foreign_file(path: str) -> None:
    """Refuse an existing file that cannot be a bank before SQLite touches it: an empty (0-byte) file,
    or one that is not a SQLite database (a bank is never either: `create_bank_file`)."""
    if os.path.isfile(path) and os.path.getsize(path) == 0:
        raise MemrlError(f"{path} is an empty file, not a memrl bank ({NEW_BANK_RULE}: remove the file, "
                         "or give another --db / MEMRL_DB)")
    if not has_sqlite_header(path):
        raise MemrlError(f"{path} is not a memrl bank: not a SQLite database (check --db / MEMRL_DB; if "
                         "it was a bank, its header is damaged: restore it from a `memrl backup` copy)")


def create_bank_file(path: str) -> None:
    """Make a new bank at `path`, which does not exist, atomically: built complete under a staging name,
    then linked into place unless a file appeared there meanwhile (another process's new bank, then
    used as it is). So a bank file is never half-made, and an existing file never becomes a bank."""
    staging = f"{path}.new-{os.getpid()}-{threading.get_ident()}"
    try:
        conn = connect(staging)
        try:
            conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")  # only a new file can choose it, before WAL and tables
            conn.execute("PRAGMA journal_mode = WAL")
            sqlite_schema.migrate(conn)
        finally:
            conn.close()  # the last connection: checkpoints the WAL into the file
        try:
            os.link(staging, path)
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links
            if not os.path.exists(path):
                os.replace(staging, path)
    finally:
        for leftover in (staging, f"{staging}-wal", f"{staging}-shm"):
            if os.path.exists(leftover):
                os.remove(leftover)
