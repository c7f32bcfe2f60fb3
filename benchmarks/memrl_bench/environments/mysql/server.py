"""One MySQL-compatible server shared by every process of a benchmark run.

Where the server comes from, in order:

1. a URL the user gives (`mysql://user:password@host:port`, `mysql_address.parse_mysql_url`):
   used as is, never started or stopped;
2. a MariaDB Docker container (`mariadb_docker`, memrl's `llb-db` image), when a Docker daemon
   answers: no network, reachable through a Unix socket in a private directory;
3. a local MariaDB (`mariadb_local`, `apt-get install mariadb-server`) started in a temporary
   data directory, reachable only through a Unix socket in a private directory.

Both start MariaDB with MySQL 8's settings (`mysql8_compat`). Cases 2 and 3 are *managed*: the
first process that needs a server starts it under a file lock, records it in a state directory
(`$TMPDIR/memrl-mysql-<uid>-grants/`), and every process that uses it registers its pid there.
`release()` (or process exit) unregisters; the last live user stops the server and removes its
data. Worker processes of one run therefore share one server, however they were started (fork,
spawn, or a fresh adapter per worker). A server left behind by killed processes is reused by
the next run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import multiprocessing.util
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator

from memrl_bench.environments.mysql import mariadb_docker
from memrl_bench.environments.mysql import mariadb_local
from memrl_bench.environments.docker_images import docker_client, require_docker
from memrl_bench.environments.mysql.address import ServerAddress, is_reachable
from memrl_cli.errors import MemrlError

SERVER_KINDS = ("auto", "docker", "mariadb")


def state_dir() -> Path:
    """Per-user directory holding the lock, the running server's record and its users' pids."""
    # "-grants": servers started before episodes got their own users ran without grant tables.
    path = Path(tempfile.gettempdir()) / f"memrl-mysql-{os.getuid()}-grants"
    path.mkdir(mode=0o700, exist_ok=True)
    if path.lstat().st_uid != os.getuid() or path.is_symlink():
        raise MemrlError(f"{path} belongs to another user: remove it or set TMPDIR to a private directory")
    (path / "users").mkdir(mode=0o700, exist_ok=True)
    return path


@contextlib.contextmanager
def _file_lock() -> Iterator[Path]:
    directory = state_dir()
    with open(directory / "lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield directory
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _live_users(directory: Path) -> list[int]:
    pids = []
    for entry in (directory / "users").iterdir():
        if entry.name.isdigit() and mariadb_local.pid_alive(int(entry.name)):
            pids.append(int(entry.name))
        else:
            entry.unlink(missing_ok=True)
    return pids


def _read_state(directory: Path) -> dict[str, Any] | None:
    try:
        return json.loads((directory / "server.json").read_text())
    except (OSError, ValueError):
        return None


def _stop(state: dict[str, Any]) -> None:
    if state["kind"] == "docker":
        mariadb_docker.stop(state)
    else:
        mariadb_local.stop(state)


_lock = threading.Lock()
_refs = 0  # acquisitions by this process that are not yet released
_exit_hook_pid: int | None = None


def _reset_after_fork() -> None:
    global _refs, _exit_hook_pid, _lock
    _refs, _exit_hook_pid, _lock = 0, None, threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


def acquire(kind: str = "auto") -> ServerAddress:
    """Register this process as a user of the shared managed server, starting one if none runs.

    `kind` chooses what to start when nothing runs: "auto" (Docker if a daemon answers, else
    MariaDB), "docker" or "mariadb". A server that already runs is reused whatever its kind.
    """
    global _refs, _exit_hook_pid
    if kind not in SERVER_KINDS:
        raise MemrlError(f"unknown server kind {kind!r}: use one of {', '.join(SERVER_KINDS)}")
    with _lock, _file_lock() as directory:
        state = _read_state(directory)
        if state is not None and state.get("users_lock") and os.path.exists(state["users_lock"]):
            mariadb_docker.hold_users_lock(state["users_lock"])
        if state is None or not is_reachable(ServerAddress(**state["address"])):
            if state is not None:  # dead or hung: clean up what it left
                mariadb_docker.drop_users_lock()
                _stop(state)
            client = require_docker() if kind == "docker" else docker_client() if kind == "auto" else None
            state = mariadb_docker.start(client, directory) if client is not None else mariadb_local.start()
            (directory / "server.json").write_text(json.dumps(state))
        (directory / "users" / str(os.getpid())).touch()
        _refs += 1
        if _exit_hook_pid != os.getpid():
            # Runs at interpreter exit and at the end of multiprocessing workers alike.
            multiprocessing.util.Finalize(None, _release_all, exitpriority=10)
            _exit_hook_pid = os.getpid()
        return ServerAddress(**state["address"])


def release() -> None:
    """Undo one `acquire`; the last user on the machine stops the server and deletes its data."""
    global _refs
    with _lock:
        if _refs == 0:
            return
        _refs -= 1
        if _refs == 0:
            _unregister()


def _release_all() -> None:
    global _refs
    with _lock:
        if _refs > 0:
            _refs = 0
            _unregister()


def _unregister() -> None:
    with _file_lock() as directory:
        mariadb_docker.drop_users_lock()
        (directory / "users" / str(os.getpid())).unlink(missing_ok=True)
        state = _read_state(directory)
        if state is not None and not _live_users(directory):
            _stop(state)
            (directory / "server.json").unlink(missing_ok=True)


def running_server() -> dict[str, Any] | None:
    """The record of the managed server if one is registered (kind, pid/container, address)."""
    with _file_lock() as directory:
        return _read_state(directory)
