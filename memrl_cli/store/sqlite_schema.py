"""The SQLite bank's schema on disk: migrating by `PRAGMA user_version`, and the untrusted-file check.

A `.db` file may come from anywhere: before memrl writes to it, every table and index it carries
must be defined exactly as memrl's migrations (`memrl_cli.store.migrations`) define them, and it may carry no
trigger. The definitions to compare with are built once per version in a scratch in-memory database
of the same driver (`connect`, given by `memrl_cli.store.sqlite`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

from memrl_cli.errors import MemrlError
from memrl_cli.store.migrations import CORE, LATEST, SETS, TABLES

INDEX_TABLE_PREFIX = "memory_index_"  # sqlite-vec's shadow tables


def run(conn: Any, statements: list[str]) -> None:
    """Run DDL statement by statement (`executescript` would commit the open transaction)."""
    for statement in statements:
        conn.execute(statement)


def migrate(conn: Any) -> int:
    """Bring the bank to the latest core schema; return the version it had."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > LATEST:
        raise MemrlError(f"this bank has schema version {version}, newer than this memrl understands "
                         f"({LATEST}); upgrade memrl (pip install -U memrl)")
    for number in range(version, LATEST):
        conn.execute("BEGIN IMMEDIATE")
        try:
            if int(conn.execute("PRAGMA user_version").fetchone()[0]) == number:
                run(conn, CORE.migrations[number].ddl("sqlite"))
                conn.execute(f"PRAGMA user_version = {number + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return version


def foreign_objects(conn: Any) -> dict[str, list[str]]:
    """Schema objects memrl did not create: triggers, views, and unknown tables."""
    found: dict[str, list[str]] = {"trigger": [], "view": [], "table": []}
    for kind, name in conn.execute("SELECT type, name FROM sqlite_master WHERE type IN ('trigger', 'view', 'table')"):
        if kind == "table" and (name in TABLES or name.startswith(INDEX_TABLE_PREFIX) or name.startswith("sqlite_")):
            continue
        found[kind].append(name)
    return found


@lru_cache(maxsize=None)
def definitions(version: int, connect: Callable[[], Any]) -> dict[str, str]:
    """The SQL of every table and index memrl creates up to core `version` (and every table of the other
    sets, which a bank carries or not), by name; `connect()` opens a scratch in-memory database."""
    conn = connect()
    try:
        for migration in CORE.migrations[:version]:
            run(conn, migration.ddl("sqlite"))
        for other in SETS:
            if other is not CORE:
                for migration in other.migrations:
                    run(conn, migration.ddl("sqlite"))
        return {name: _normal(sql) for name, sql in conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type IN ('table', 'index') AND sql IS NOT NULL")}
    finally:
        conn.close()


def _normal(sql: str | None) -> str:
    return " ".join((sql or "").split())


def _short(name: str) -> str:
    """A name from the file, cut to a readable length."""
    return name if len(name) <= 60 else name[:57] + "..."


def check_trusted(conn: Any, connect: Callable[[], Any], name: str = "this SQLite file") -> list[str]:
    """Refuse a foreign SQLite file, or a bank carrying triggers, extra indexes, or memrl tables
    defined differently; return warnings about other foreign objects.

    A trigger would run its SQL whenever memrl writes; an index or a table definition runs
    its expressions and constraints on writes too. Views and extra tables are ignored
    (memrl never reads them) but reported.
    """
    found = foreign_objects(conn)
    if found["trigger"]:
        names = ", ".join(_short(n) for n in found["trigger"][:5])
        raise MemrlError(f"refusing to open a bank with triggers memrl did not create ({names}): "
                         "they would run on every write; inspect them with sqlite3 and drop them if you trust the file")
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if version <= 0 or not {"meta", "memories"} <= tables:
        what = ("an empty SQLite database" if not tables - {"sqlite_sequence"} else
                "it has tables but no memrl schema version" if version <= 0 else "it lacks memrl's tables")
        raise MemrlError(f"{name} is not a memrl bank ({what}); memrl makes a new bank only where no "
                         "file exists: give a new path or a memrl bank")
    expected = definitions(version, connect) if version <= LATEST else {}
    for kind, name, sql in conn.execute("SELECT type, name, sql FROM sqlite_master WHERE type IN ('table', 'index') "
                                        "AND sql IS NOT NULL"):
        if name in expected and _normal(sql) != expected[name]:
            raise MemrlError(f"refusing to open this bank: its {kind} {_short(name)!r} is not defined as memrl defines "
                             "it (the file was not written by memrl, or was altered)")
        if kind == "index" and name not in expected and expected:
            raise MemrlError(f"refusing to open a bank with an index memrl did not create ({_short(name)!r}): "
                             "it would run on every write; drop it with sqlite3 if you trust the file")
    return [f"ignoring {kind} {_short(name)!r}, which memrl did not create" for kind in ("view", "table")
            for name in found[kind]]


def index_ddl(dim: int) -> str:
    """The sqlite-vec index as memrl creates it (as SQLite stores it: without IF NOT EXISTS)."""
    return (f"CREATE VIRTUAL TABLE memory_index USING vec0(memory_id INTEGER PRIMARY KEY, "
            f"embedding float[{dim}] distance_metric=cosine)")


def index_matches(conn: Any, dim: int) -> bool:
    """Whether the bank's `memory_index` exists and is exactly memrl's vec0 table for `dim`."""
    row = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'memory_index'").fetchone()
    return row is not None and _normal(row[0]) == _normal(index_ddl(dim))
