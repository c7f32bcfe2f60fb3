"""One MySQL-compatible server shared by every process of a benchmark run.

Where the server comes from, in order:

1. a URL the user gives (`mysql://user:password@host:port`): used as is, never started or stopped;
2. a MariaDB Docker container (memrl's `llb-db` image, `memrl_bench.environments.docker_images`), when a
   Docker daemon answers: no network, reachable through a Unix socket in a private directory;
3. a local MariaDB (`apt-get install mariadb-server`) started in a temporary data directory,
   reachable only through a Unix socket in a private directory.

Cases 2 and 3 are *managed*: the first process that needs a server starts it under a file lock,
records it in a state directory (`$TMPDIR/memrl-mysql-<uid>-grants/`), and every process that uses it
registers its pid there. `release()` (or process exit) unregisters; the last live user stops the
server and removes its data. Worker processes of one run therefore share one server, however
they were started (fork, spawn, or a fresh adapter per worker). A server left behind by killed
processes is reused by the next run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import multiprocessing.util
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qs, unquote, urlparse

import re

import pymysql

from memrl_bench.environments.docker_images import docker_client, ensure_image, require_docker
from memrl_cli.errors import MemrlError

SERVER_KINDS = ("auto", "docker", "mariadb")
# MySQL 8's defaults, so that a MariaDB server groups, sorts and concatenates like LLB's MySQL.
MYSQL8_SQL_MODE = (
    "ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"
    "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION"
)
_MARIADB_SETTINGS = (
    "--character-set-server=utf8mb4",
    "--collation-server=utf8mb4_unicode_520_ci",
    f"--sql-mode={MYSQL8_SQL_MODE}",
    "--group-concat-max-len=1024",
    "--max-connections=500",
    "--skip-log-bin",
)
_INNODB_SETTINGS = (
    "--innodb-buffer-pool-size=64M",
    "--innodb-log-file-size=16M",
    "--innodb-flush-log-at-trx-commit=2",
)
_MARIADB_START_TIMEOUT = 60.0
_DOCKER_START_TIMEOUT = 120.0
# Limits of the Docker server: the data directory is a tmpfs inside the memory limit; every
# connection is a thread (max-connections 500).
_DOCKER_LIMITS = {"mem_limit": 1 << 30, "memswap_limit": 1 << 30, "pids_limit": 1024, "nano_cpus": 2_000_000_000}
_DOCKER_DATA_SIZE = "512m"
_DOCKER_RUN = "/run/memrl"  # where the container sees its private host directory (socket, logs, users.lock)
# The Docker server's first process: initialise a data directory on the tmpfs, start mariadbd
# on a socket in the host directory, then stop it as soon as no process holds a shared lock on
# users.lock. Every process using the server holds one (`_hold_users_lock`) and the kernel drops
# it however that process ends, so the container goes away even if its users are all killed.
_DOCKER_SERVER_SCRIPT = """set -e
mariadb-install-db --no-defaults --datadir=/var/lib/mysql --user=root --auth-root-authentication-method=normal \
  --skip-test-db {innodb} >{run}/install.log 2>&1
mariadbd --no-defaults --datadir=/var/lib/mysql --socket={run}/mysqld.sock --skip-networking --user=root \
  --init-file={run}/init.sql --log-error={run}/error.log {settings} {innodb} &
server=$!
exec 9<{run}/users.lock
until flock -x -n 9; do sleep 1; done
kill -TERM $server
wait $server
"""
_STOP_TIMEOUT = 30.0
_SEARCH_DIRS = ("/usr/sbin", "/usr/local/sbin", "/sbin", "/usr/libexec", "/usr/local/mysql/bin")
INSTALL_HINT = (
    "no MySQL-compatible server available: install MariaDB (`apt-get install mariadb-server`), "
    "start a Docker daemon, or pass `--option mysql_url=mysql://user:password@host:port`"
)


@dataclass(frozen=True)
class ServerAddress:
    """How to reach a server (picklable, so worker processes can receive it)."""

    user: str = "root"
    password: str = ""
    host: str = "127.0.0.1"
    port: int = 3306
    unix_socket: str | None = None
    tls: bool = False  # encrypt, without verifying the certificate (MySQL 8's password auth needs it over TCP)

    def connect(self, database: str | None = None, *, timeout: float = 60.0) -> pymysql.connections.Connection:
        """Open a new connection (autocommit off, utf8mb4); `timeout` bounds each read and write."""
        context = None
        if self.tls:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return pymysql.connect(
            ssl=context,
            user=self.user,
            password=self.password,
            host=self.host,
            port=self.port,
            unix_socket=self.unix_socket,
            database=database,
            charset="utf8mb4",
            autocommit=False,
            connect_timeout=10,
            read_timeout=timeout,
            write_timeout=timeout,
        )


def parse_mysql_url(url: str) -> ServerAddress:
    """`mysql://user:password@host:port` to an address.

    Query parameters: `unix_socket=/path` connects through a socket; `ssl=true` encrypts, which
    a MySQL 8 server needs for password logins over TCP (PyMySQL has no RSA support without
    the `cryptography` package).
    """
    parsed = urlparse(url)
    if parsed.scheme not in ("mysql", "mariadb") or not (parsed.hostname or "unix_socket" in parsed.query):
        raise MemrlError(f"bad mysql_url {url!r}: expected mysql://user:password@host:port")
    query = parse_qs(parsed.query)
    socket_path = query.get("unix_socket", [None])[0]
    return ServerAddress(
        tls=query.get("ssl", ["false"])[0].lower() in ("1", "true", "yes"),
        user=unquote(parsed.username or "root"),
        password=unquote(parsed.password or ""),
        host=parsed.hostname or "localhost",
        port=parsed.port or 3306,
        unix_socket=socket_path,
    )


def is_reachable(address: ServerAddress) -> bool:
    """True when a connection to `address` succeeds."""
    try:
        address.connect(timeout=5).close()
    except pymysql.Error:
        return False
    return True


def find_mariadb() -> tuple[str, str] | None:
    """Paths of `mariadbd` and `mariadb-install-db`, or None when MariaDB is not installed."""
    search_path = os.pathsep.join([os.environ.get("PATH", ""), *_SEARCH_DIRS])
    server = shutil.which("mariadbd", path=search_path)
    installer = shutil.which("mariadb-install-db", path=search_path)
    return (server, installer) if server and installer else None


# --------------------------------------------------------------------------- MySQL 8 on MariaDB

_DELETE_WITH_ALIAS = re.compile(r"\s*DELETE\s+FROM\s+(`[^`]+`|\w+)\s+AS\s+(`[^`]+`|\w+)\s", re.IGNORECASE)
_CLAUSE_AFTER_GROUPS = re.compile(r"\b(WINDOW|LIMIT|FOR\s+UPDATE|LOCK\s+IN|INTO)\b")


def _top_level(sql: str) -> str:
    """`sql` upper-cased with quoted text and everything inside parentheses blanked (same length)."""
    out: list[str] = []
    depth, quote, index = 0, "", 0
    while index < len(sql):
        char = sql[index]
        if quote:
            if char == "\\" and quote != "`":
                out.append("  ")
                index += 2
                continue
            if char == quote:
                if sql[index + 1:index + 2] == quote:  # doubled quote inside the literal
                    out.append("  ")
                    index += 2
                    continue
                quote = ""
            out.append(" ")
        elif char in "'\"`":
            quote = char
            out.append(" ")
        elif char in "()":
            depth = depth + 1 if char == "(" else max(0, depth - 1)
            out.append(" ")
        elif depth:
            out.append(" ")
        else:
            upper = char.upper()
            out.append(upper if len(upper) == 1 else char)  # keep one character per character
        index += 1
    return "".join(out)[: len(sql)]  # an escape at the very end adds one blank too many


def as_mysql8(statement: str) -> str:
    """Rewrite one statement so that MariaDB runs it the way MySQL 8 does.

    * `DELETE FROM t AS a WHERE ...` (MySQL-only syntax) becomes `DELETE a FROM t AS a WHERE ...`.
    * MariaDB sorts the result of a top-level GROUP BY that has no ORDER BY; MySQL 8 returns
      groups in the order it meets them, which is what LLB's expected rows follow. Appending
      `ORDER BY NULL` makes MariaDB do the same.
    """
    delete = _DELETE_WITH_ALIAS.match(statement)
    if delete and not re.search(r"\b(ORDER\s+BY|LIMIT)\b", _top_level(statement)):
        return f"DELETE {delete.group(2)} FROM {delete.group(1)} AS {delete.group(2)} {statement[delete.end():]}"
    top = _top_level(statement)
    group = re.search(r"\bGROUP\s+BY\b", top)
    if (
        group is None
        or not re.match(r"\s*(SELECT|WITH)\b", top)
        or re.search(r"\b(ORDER\s+BY|UNION|INTERSECT|EXCEPT|ROLLUP)\b", top)
    ):
        return statement
    tail = _CLAUSE_AFTER_GROUPS.search(top, group.end())
    cut = tail.start() if tail else len(statement.rstrip())
    return f"{statement[:cut].rstrip()} ORDER BY NULL {statement[cut:].lstrip()}".rstrip()


# --------------------------------------------------------------------------- managed servers


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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its parent) is not alive
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _live_users(directory: Path) -> list[int]:
    pids = []
    for entry in (directory / "users").iterdir():
        if entry.name.isdigit() and _pid_alive(int(entry.name)):
            pids.append(int(entry.name))
        else:
            entry.unlink(missing_ok=True)
    return pids


def _read_state(directory: Path) -> dict[str, Any] | None:
    try:
        return json.loads((directory / "server.json").read_text())
    except (OSError, ValueError):
        return None


def _start_mariadb() -> dict[str, Any]:
    binaries = find_mariadb()
    if binaries is None:
        raise MemrlError(INSTALL_HINT)
    server, installer = binaries
    # In memory when possible: a throwaway database needs no durable writes, and fsync on a
    # busy disk makes initialisation 10x slower.
    memory = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    root = Path(tempfile.mkdtemp(prefix="memrl-mariadb-", dir=memory))
    datadir, socket_path, log = root / "data", root / "mysqld.sock", root / "error.log"
    as_root = ["--user=root"] if os.geteuid() == 0 else []
    install = subprocess.run(
        [installer, "--no-defaults", f"--datadir={datadir}", "--auth-root-authentication-method=normal",
         "--skip-test-db", *as_root, *_INNODB_SETTINGS],
        capture_output=True, text=True, timeout=120,
    )
    if install.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise MemrlError(f"mariadb-install-db failed: {(install.stderr or install.stdout).strip()[-300:]}")
    process = subprocess.Popen(
        [server, "--no-defaults", f"--datadir={datadir}", f"--socket={socket_path}", "--skip-networking",
         f"--pid-file={root / 'mysqld.pid'}", f"--log-error={log}", *as_root,
         *_MARIADB_SETTINGS, *_INNODB_SETTINGS],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,  # outlives the process that started it; the last user stops it
    )
    address = ServerAddress(user="root", unix_socket=str(socket_path))
    deadline = time.monotonic() + _MARIADB_START_TIMEOUT
    while not (socket_path.exists() and is_reachable(address)):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            tail = log.read_text(errors="replace")[-400:] if log.exists() else ""
            shutil.rmtree(root, ignore_errors=True)
            raise MemrlError(f"MariaDB did not start: {tail.strip()}")
        time.sleep(0.1)
    _started_here[process.pid] = process
    return {"kind": "mariadb", "pid": process.pid, "root": str(root), "address": asdict(address)}


_SOCKET_PATH_MAX = 107  # sockaddr_un.sun_path on Linux, less its terminating NUL


def _start_docker(client: Any, directory: Path) -> dict[str, Any]:
    """Start the MariaDB container; `directory` (private) becomes its run directory."""
    import docker

    image = ensure_image(client, "llb-db")
    run = Path(tempfile.mkdtemp(prefix="d", dir=directory))
    if len(os.fsencode(run / "mysqld.sock")) > _SOCKET_PATH_MAX:
        shutil.rmtree(run, ignore_errors=True)
        raise MemrlError(f"the MariaDB socket path under {directory} is longer than a Unix socket allows "
                         f"({_SOCKET_PATH_MAX} bytes): set TMPDIR to a shorter directory")
    password = secrets.token_hex(16)
    (run / "init.sql").write_text(f"ALTER USER root@localhost IDENTIFIED BY '{password}';\n")
    (run / "users.lock").touch()
    _hold_users_lock(str(run / "users.lock"))  # before the container starts watching it
    script = _DOCKER_SERVER_SCRIPT.format(run=_DOCKER_RUN, settings=" ".join(_MARIADB_SETTINGS),
                                          innodb=" ".join(_INNODB_SETTINGS))
    try:
        container = client.containers.run(
            image, ["sh", "-c", script], name=f"memrl-mysql-{os.getuid()}-{run.name}", detach=True,
            auto_remove=True, network_mode="none", tmpfs={"/var/lib/mysql": f"size={_DOCKER_DATA_SIZE}"},
            volumes={str(run): {"bind": _DOCKER_RUN, "mode": "rw"}}, labels={"memrl.server": "llb-db"},
            **_DOCKER_LIMITS,
        )
    except docker.errors.APIError as exc:
        shutil.rmtree(run, ignore_errors=True)
        raise MemrlError(f"could not start the MariaDB container from {image}: {exc}") from exc
    address = ServerAddress(user="root", password=password, unix_socket=str(run / "mysqld.sock"))
    state = {"kind": "docker", "container": container.id, "run": str(run), "users_lock": str(run / "users.lock"),
             "address": asdict(address)}
    deadline = time.monotonic() + _DOCKER_START_TIMEOUT
    while not ((run / "mysqld.sock").exists() and is_reachable(address)):
        try:
            container.reload()
            running = container.status in ("created", "running")
        except docker.errors.NotFound:  # exited, and auto-removed
            running = False
        if not running or time.monotonic() > deadline:
            logs = " ".join((run / name).read_text(errors="replace")[-300:] for name in ("install.log", "error.log")
                            if (run / name).exists())
            _stop(state)
            raise MemrlError(f"the MariaDB container from {image} did not start: {logs.strip() or 'no log'}")
        time.sleep(0.2)
    return state


def _is_server_process(pid: int, root: str) -> bool:
    try:
        return root in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace") and _pid_alive(pid)
    except OSError:
        return False


def _stop(state: dict[str, Any]) -> None:
    if state["kind"] == "docker":
        client = docker_client()
        if client is not None:
            _remove_container(client, state["container"])
        shutil.rmtree(state["run"], ignore_errors=True)
        return
    pid = state["pid"]
    if _is_server_process(pid, state["root"]):  # else gone already, and its pid possibly reused
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_TIMEOUT
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    process = _started_here.pop(pid, None)
    if process is not None:  # started by this process: reap it
        process.wait()
    shutil.rmtree(state["root"], ignore_errors=True)


def _remove_container(client: Any, container_id: str) -> None:
    """Kill and remove a container; return once Docker no longer lists it."""
    import docker

    try:
        client.api.remove_container(container_id, force=True)
    except docker.errors.APIError:
        pass  # already gone, or its auto-removal is under way
    deadline = time.monotonic() + _STOP_TIMEOUT
    while time.monotonic() < deadline:
        try:
            client.api.inspect_container(container_id)
        except docker.errors.NotFound:
            return
        time.sleep(0.1)


_started_here: dict[int, subprocess.Popen] = {}
_lock = threading.Lock()
_refs = 0  # acquisitions by this process that are not yet released
_exit_hook_pid: int | None = None
_users_lock: tuple[str, int] | None = None  # (path, fd) of the Docker server's users.lock this process holds


def _hold_users_lock(path: str) -> None:
    """Hold a shared lock on a Docker server's users.lock until `_drop_users_lock` or process exit.

    Waits while the server's container holds it exclusively: then it is stopping, and the
    caller sees it unreachable once the lock comes.
    """
    global _users_lock
    if _users_lock is not None and _users_lock[0] == path:
        return
    _drop_users_lock()
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    deadline = time.monotonic() + _STOP_TIMEOUT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise MemrlError(f"the MariaDB container of {path} does not stop; remove it with `docker rm -f`")
            time.sleep(0.1)
    _users_lock = (path, fd)


def _drop_users_lock() -> None:
    global _users_lock
    if _users_lock is not None:
        os.close(_users_lock[1])
        _users_lock = None


def _reset_after_fork() -> None:
    global _refs, _exit_hook_pid, _lock, _users_lock
    _refs, _exit_hook_pid, _lock = 0, None, threading.Lock()
    _started_here.clear()
    if _users_lock is not None:  # the parent's: closing this copy leaves the parent's lock in place
        os.close(_users_lock[1])
        _users_lock = None


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
            _hold_users_lock(state["users_lock"])
        if state is None or not is_reachable(ServerAddress(**state["address"])):
            if state is not None:  # dead or hung: clean up what it left
                _drop_users_lock()
                _stop(state)
            client = require_docker() if kind == "docker" else docker_client() if kind == "auto" else None
            state = _start_docker(client, directory) if client is not None else _start_mariadb()
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
        _drop_users_lock()
        (directory / "users" / str(os.getpid())).unlink(missing_ok=True)
        state = _read_state(directory)
        if state is not None and not _live_users(directory):
            _stop(state)
            (directory / "server.json").unlink(missing_ok=True)


def running_server() -> dict[str, Any] | None:
    """The record of the managed server if one is registered (kind, pid/container, address)."""
    with _file_lock() as directory:
        return _read_state(directory)
