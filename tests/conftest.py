"""Shared fixtures: a PostgreSQL + pgvector server for the tests marked `postgres`.

The server is `MEMRL_TEST_PG_DSN` when set (an admin DSN of a server with pgvector >= 0.8 that may
create databases), else a throwaway local server (benchmarks/pg_server.py) started once per session.
Without either, the tests that use it are skipped, except under CI (`CI` set), where they fail.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import NoReturn

import pytest

from memrl_cli.errors import MemrlError


def _unavailable(reason: str) -> NoReturn:
    """Skip the requesting test; under CI, fail it instead, so CI really tests PostgreSQL."""
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(f"PostgreSQL is required under CI: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def pg_server_dsn() -> Iterator[str]:
    """Admin DSN of the session's PostgreSQL + pgvector server (may create and drop databases)."""
    external = os.environ.get("MEMRL_TEST_PG_DSN")
    if external:
        yield external
        return
    try:
        from benchmarks.pg_server import LocalPostgres

        server = LocalPostgres()
        server.start()
    except ImportError as exc:  # psycopg (the `postgres` extra) is missing
        problem = f"no PostgreSQL client: {exc} (pip install -e '.[dev]')"
    except MemrlError as exc:
        problem = str(exc)
    else:
        problem = ""
    if problem:
        _unavailable(problem)  # outside the except blocks, so the report shows no chained traceback
    try:
        yield server.dsn
    finally:
        server.stop()


@pytest.fixture
def pg_dsn(pg_server_dsn: str) -> Iterator[str]:
    """DSN of a fresh database with the vector extension, dropped after the test."""
    from benchmarks.pg_server import create_database, drop_database

    name = f"memrl_test_{uuid.uuid4().hex[:8]}"
    dsn = create_database(pg_server_dsn, name)
    try:
        yield dsn
    finally:
        drop_database(pg_server_dsn, name)
