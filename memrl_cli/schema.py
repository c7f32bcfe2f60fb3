"""The bank's schema: numbered migrations, the version check, and the untrusted-file check.

The schema version is SQLite's `PRAGMA user_version`. Each migration runs in the same
transaction as the version bump, so a bank is always at exactly one version. A bank
with a newer version than this memrl knows is refused rather than guessed at.
A PostgreSQL bank runs the same migrations, in PostgreSQL's types (`memrl_cli.postgres`).
See docs/schema.md for every table and column.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from memrl_cli.errors import MemrlError

Migration = Callable[[Any], None]


def _run(conn: Any, script: str) -> None:
    """Run DDL statement by statement (`executescript` would commit the open transaction)."""
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)


def m001_initial(conn: Any) -> None:
    """Memories, receipts, the reward ledger and meta."""
    _run(conn, """
        CREATE TABLE memories (
            id INTEGER PRIMARY KEY,
            intent TEXT NOT NULL,
            experience TEXT NOT NULL,
            outcome TEXT NOT NULL DEFAULT 'unknown' CHECK (outcome IN ('success', 'failure', 'unknown')),
            task_id TEXT,
            source TEXT,
            q REAL NOT NULL DEFAULT 0,
            q_init REAL NOT NULL DEFAULT 0,
            visits INTEGER NOT NULL DEFAULT 0,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            last_used_at TEXT,
            metadata TEXT NOT NULL DEFAULT '{}',
            content_hash TEXT NOT NULL UNIQUE,
            embedding BLOB NOT NULL
        );
        CREATE INDEX memories_q ON memories (q DESC);
        CREATE INDEX memories_task ON memories (task_id);
        CREATE TABLE retrievals (
            id INTEGER PRIMARY KEY,
            query TEXT NOT NULL,
            params TEXT NOT NULL,
            sim_mean REAL NOT NULL,
            sim_std REAL NOT NULL,
            explored INTEGER NOT NULL DEFAULT 0,
            created_at TEXT NOT NULL
        );
        CREATE TABLE retrieval_candidates (
            retrieval_id INTEGER NOT NULL REFERENCES retrievals (id),
            memory_id INTEGER NOT NULL REFERENCES memories (id),
            recall_rank INTEGER NOT NULL,
            similarity REAL NOT NULL,
            q REAL NOT NULL,
            z_sim REAL NOT NULL,
            z_q REAL NOT NULL,
            score REAL NOT NULL,
            selected_rank INTEGER,
            PRIMARY KEY (retrieval_id, memory_id)
        );
        CREATE INDEX retrieval_candidates_memory ON retrieval_candidates (memory_id);
        CREATE TABLE rewards (
            id INTEGER PRIMARY KEY,
            retrieval_id INTEGER REFERENCES retrievals (id),
            memory_id INTEGER NOT NULL REFERENCES memories (id),
            kind TEXT NOT NULL DEFAULT 'reward' CHECK (kind IN ('reward', 'set')),
            reward REAL,
            alpha REAL,
            q_floor REAL,
            q_before REAL NOT NULL,
            q_after REAL NOT NULL,
            created_at TEXT NOT NULL,
            source TEXT
        );
        CREATE INDEX rewards_memory ON rewards (memory_id, id);
        CREATE INDEX rewards_retrieval ON rewards (retrieval_id);
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """)


def m002_runs(conn: Any) -> None:
    """Benchmark runs and their per-episode records (the harness's checkpoint)."""
    _run(conn, """
        CREATE TABLE runs (
            id TEXT PRIMARY KEY,
            benchmark TEXT NOT NULL,
            method TEXT NOT NULL,
            config TEXT NOT NULL,
            models TEXT NOT NULL,
            seed INTEGER,
            code_version TEXT,
            status TEXT NOT NULL DEFAULT 'running',
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        );
        CREATE TABLE episodes (
            id INTEGER PRIMARY KEY,
            run_id TEXT NOT NULL REFERENCES runs (id),
            phase TEXT NOT NULL,
            split TEXT NOT NULL,
            epoch INTEGER NOT NULL,
            batch INTEGER NOT NULL,
            position INTEGER NOT NULL,
            task_id TEXT NOT NULL,
            success INTEGER NOT NULL,
            reward REAL,
            steps INTEGER NOT NULL,
            status TEXT,
            env_error INTEGER NOT NULL DEFAULT 0,
            retrieval_id INTEGER REFERENCES retrievals (id),
            memory_ids TEXT NOT NULL,
            new_memory_id INTEGER REFERENCES memories (id),
            usage TEXT NOT NULL DEFAULT '{}',
            created_at TEXT NOT NULL,
            UNIQUE (run_id, phase, split, epoch, position)
        );
        CREATE TABLE run_batches (
            run_id TEXT NOT NULL REFERENCES runs (id),
            phase TEXT NOT NULL,
            split TEXT NOT NULL,
            epoch INTEGER NOT NULL,
            batch INTEGER NOT NULL,
            completed_at TEXT NOT NULL,
            PRIMARY KEY (run_id, phase, split, epoch, batch)
        );
    """)


def m003_query_cache(conn: Any) -> None:
    """Embeddings of recently retrieved query texts, so a repeated query skips the embedding model."""
    _run(conn, """
        CREATE TABLE query_cache (
            key TEXT PRIMARY KEY,
            vector BLOB NOT NULL,
            created_at TEXT NOT NULL
        );
    """)


def m004_receipt_query_vector(conn: Any) -> None:
    """The query's vector on each receipt, for utilities conditioned on the query (`conditioned` selector)."""
    _run(conn, "ALTER TABLE retrievals ADD COLUMN query_vector BLOB")


def m005_hygiene(conn: Any) -> None:
    """Memory hygiene for shared banks: a quarantine mark on memories and the log of quarantines
    and releases (who, when, why); an index on sources for `retrieve --source`."""
    _run(conn, """
        ALTER TABLE memories ADD COLUMN quarantined_at TEXT;
        CREATE INDEX memories_quarantined ON memories (id) WHERE quarantined_at IS NOT NULL;
        CREATE INDEX memories_source ON memories (source);
        CREATE TABLE quarantine_log (
            id INTEGER PRIMARY KEY,
            memory_id INTEGER NOT NULL REFERENCES memories (id),
            action TEXT NOT NULL CHECK (action IN ('quarantine', 'release')),
            reason TEXT,
            actor TEXT,
            created_at TEXT NOT NULL
        );
        CREATE INDEX quarantine_log_memory ON quarantine_log (memory_id, id);
    """)


MIGRATIONS: list[Migration] = [m001_initial, m002_runs, m003_query_cache, m004_receipt_query_vector,
                              m005_hygiene]
LATEST = len(MIGRATIONS)

TABLES = {"memories", "retrievals", "retrieval_candidates", "rewards", "meta", "runs", "episodes",
          "run_batches", "memory_index", "query_cache", "quarantine_log"}
INDEX_TABLE_PREFIX = "memory_index_"  # sqlite-vec's shadow tables


def migrate(conn: Any) -> int:
    """Bring the bank to the latest schema; return the version it had."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > LATEST:
        raise MemrlError(f"this bank has schema version {version}, newer than this memrl understands "
                         f"({LATEST}); upgrade memrl (pip install -U memrl)")
    for number in range(version, LATEST):
        conn.execute("BEGIN IMMEDIATE")
        try:
            if int(conn.execute("PRAGMA user_version").fetchone()[0]) == number:
                MIGRATIONS[number](conn)
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
def definitions(version: int) -> dict[str, str]:
    """The SQL of every table and index memrl's migrations create up to `version`, by name."""
    from memrl_cli.sqlite import driver

    conn = driver.connect(":memory:", isolation_level=None)
    try:
        for migration in MIGRATIONS[:version]:
            migration(conn)
        return {name: _normal(sql) for name, sql in conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type IN ('table', 'index') AND sql IS NOT NULL")}
    finally:
        conn.close()


def _normal(sql: str | None) -> str:
    return " ".join((sql or "").split())


def _short(name: str) -> str:
    """A name from the file, cut to a readable length."""
    return name if len(name) <= 60 else name[:57] + "..."


def check_trusted(conn: Any) -> list[str]:
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
    if version < 0 or (version == 0 and conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchone()[0]):
        raise MemrlError("this SQLite file is not a memrl bank (it has tables but no memrl schema version); "
                         "give a new file or a memrl bank")
    expected = definitions(version) if version <= LATEST else {}
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


MAX_DIM = 65_536
MAX_META_BYTES = 1_000_000


def index_ddl(dim: int) -> str:
    """The sqlite-vec index as memrl creates it (as SQLite stores it: without IF NOT EXISTS)."""
    return (f"CREATE VIRTUAL TABLE memory_index USING vec0(memory_id INTEGER PRIMARY KEY, "
            f"embedding float[{dim}] distance_metric=cosine)")


def index_matches(conn: Any, dim: int) -> bool:
    """Whether the bank's `memory_index` exists and is exactly memrl's vec0 table for `dim`."""
    row = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'memory_index'").fetchone()
    return row is not None and _normal(row[0]) == _normal(index_ddl(dim))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _meta_problem(key: str, raw: Any) -> str | None:
    """Why a meta value cannot have been written by memrl, or None."""
    if not isinstance(raw, str) or len(raw) > MAX_META_BYTES:
        return "is not a short JSON text"
    try:
        value = json.loads(raw)
    except ValueError:
        return "is not JSON"
    if not isinstance(value, dict):
        return "is not a JSON object"
    if key == "embedder":
        spec, dim, probe = value.get("spec"), value.get("dim"), value.get("probe")
        if not isinstance(spec, str) or not 0 < len(spec) <= 200:
            return "has no valid embedder spec"
        if not isinstance(dim, int) or isinstance(dim, bool) or not 0 < dim <= MAX_DIM:
            return f"has an impossible dimension (1 to {MAX_DIM})"
        if probe is not None and not (isinstance(probe, list) and len(probe) == dim and all(map(_finite, probe))):
            return "has a probe vector that does not fit its dimension"
    elif key == "index":
        if value.get("state") not in ("ok", "stale") and value.get("kind") != "hnsw":
            return "has an unknown index state"
        ef_search = value.get("ef_search", 100)
        if not isinstance(ef_search, int) or isinstance(ef_search, bool) or not 1 <= ef_search <= 1000:
            return "has an HNSW ef_search outside 1 to 1000"
    elif not (_finite(value.get("mean")) and _finite(value.get("std")) and value["std"] > 0):
        return "has no finite mean and positive std"
    elif key == "sim_stats" and not (isinstance(value.get("memories"), int) and value["memories"] >= 0):
        return "has no memory count"
    return None


def check_meta(conn: Any) -> None:
    """Refuse a bank whose meta values memrl could not have written (foreign or altered file)."""
    for key, raw in conn.execute("SELECT key, value FROM meta WHERE key IN "
                                 "('embedder', 'index', 'sim_stats', 'sim_stats_override')"):
        problem = _meta_problem(key, raw)
        if problem:
            raise MemrlError(f"refusing to open this bank: its meta value {key!r} {problem} "
                             "(the file was not written by memrl, or was altered)")
