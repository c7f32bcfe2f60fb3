"""Shared fixtures: a PostgreSQL + pgvector server for the tests marked `postgres`; one policy for what
a test needs and this machine lacks (`unavailable`: skip, or fail under CI); one error-line asserter;
one runner of the `memrl` command as a real subprocess (`run_memrl`, in the environment `cli_env`).

`bank_at` runs a test once per engine: it makes new bank locations (SQLite files, or fresh
PostgreSQL databases). The server is `MEMRL_TEST_PG_DSN` when set (an admin `postgresql://` URL of a
server with pgvector >= 0.8 that may create databases), else a throwaway local server (benchmarks/testing/pg_server.py) started once per session.
Without either, the tests that use it are skipped, except under CI (`CI` set), where they fail.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from memrl_cli.errors import MemrlError


def under_ci() -> bool:
    """Whether `CI` is set (to anything but an empty or false value): then PostgreSQL must be tested."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def unavailable(reason: str, needed: str = "PostgreSQL") -> NoReturn:
    """Skip the requesting test; under CI, fail it instead, so CI really tests what it needs
    (PostgreSQL, benchmark data: tests/bench_data.py)."""
    if under_ci():
        pytest.fail(f"{needed} is required under CI: {reason}", pytrace=False)
    pytest.skip(reason)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked `benchmark_data(benchmark, path)` (`bench_data.needs`) runs only where `path` exists."""
    mark = item.get_closest_marker("benchmark_data")
    if mark is not None and not Path(mark.args[1]).is_file():
        import bench_data

        bench_data.unavailable(mark.args[0], Path(mark.args[1]).parent)


def error_line(done: Any) -> str:
    """A failed `memrl` command's one error line: a non-zero exit, no traceback, and exactly one line on
    stderr, starting `memrl: error: ` (`done`: a CompletedProcess, or anything with `returncode`, `stderr`)."""
    assert done.returncode != 0, f"the command succeeded: {done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memrl: error: "), done.stderr
    return lines[0]


TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
CHOOSERS = ("MEMRL_DB", "MEMRL_TOKEN", "OPENAI_API_KEY", "OPENAI_BASE_URL", "MEMRL_MODEL",  # pick a bank, a secret,
            "MEMRL_JUDGE_BASE_URL", "MEMRL_JUDGE_API_KEY")  # an LLM, a judge


def cli_env(**variables: str) -> dict[str, str]:
    """The environment of a `memrl` subprocess: this one without the variables that pick a bank, a
    server's token, an LLM endpoint or a judge's (`CHOOSERS`), with the tests' and the repository's modules importable (the toy
    benchmark), then `variables` (e.g. `MEMRL_DB=...`, `OPENAI_API_KEY=...`)."""
    env = {k: v for k, v in os.environ.items() if k not in CHOOSERS}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(ROOT), env.get("PYTHONPATH", "")])
    return env | variables


def run_memrl(*args: str, env: dict[str, str] | None = None, stdin: str | None = None, timeout: float = 120,
              ok: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `python -m memrl_cli ARGS` as a real subprocess, in `cli_env()` plus `env`, capturing its text
    output; with `ok` (unless told otherwise), require exit code 0."""
    done = subprocess.run([sys.executable, "-m", "memrl_cli", *args], input=stdin, capture_output=True, text=True,
                          env=cli_env(**(env or {})), timeout=timeout)
    if ok:
        assert done.returncode == 0, f"{args}: {done.stderr}"
    return done


@pytest.fixture(scope="session")
def pg_server_dsn() -> Iterator[str]:
    """Admin DSN of the session's PostgreSQL + pgvector server (may create and drop databases)."""
    external = os.environ.get("MEMRL_TEST_PG_DSN")
    if external:
        yield external
        return
    try:
        from benchmarks.testing.pg_server import LocalPostgres

        server = LocalPostgres()
        server.start()
    except ImportError as exc:  # psycopg (the `postgres` extra) is missing
        problem = f"no PostgreSQL client: {exc} (pip install -e '.[dev]')"
    except MemrlError as exc:
        problem = str(exc)
    else:
        problem = ""
    if problem:
        unavailable(problem)  # outside the except blocks, so the report shows no chained traceback
    try:
        yield server.dsn
    finally:
        server.stop()


@pytest.fixture
def pg_dsn(pg_server_dsn: str) -> Iterator[str]:
    """URL of a fresh database with the vector extension, dropped after the test."""
    from benchmarks.testing.pg_server import temporary_database

    with temporary_database(pg_server_dsn, "memrl_test") as url:
        yield url


ENGINES = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(params=ENGINES)
def bank_at(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """A factory of new bank locations on the engine under test: `bank_at("b")` is a file
    `tmp_path/b.db` on SQLite, or the URL of a fresh database on PostgreSQL (dropped afterwards)."""
    if request.param == "sqlite":
        yield lambda name: str(tmp_path / f"{name}.db")
        return
    from benchmarks.testing.pg_server import temporary_database

    server = request.getfixturevalue("pg_server_dsn")
    with contextlib.ExitStack() as databases:
        made: dict[str, str] = {}

        def location(name: str) -> str:
            if name not in made:
                made[name] = databases.enter_context(temporary_database(server, "memrl_test"))
            return made[name]

        yield location
