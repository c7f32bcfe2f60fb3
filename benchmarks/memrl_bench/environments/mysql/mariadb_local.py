"""A MariaDB server on this machine (`apt-get install mariadb-server`), in a throwaway data directory.

`start` initialises a data directory (in /dev/shm when it can) and starts `mariadbd` there in a
session of its own, reachable only through a Unix socket in that directory; it returns the
server's record for `mysql_server`. `stop` ends the server that record names, and only that
one (never a process that reused its pid), and deletes its data.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from memrl_bench.environments.mysql.mysql8_compat import INNODB_SETTINGS, SERVER_SETTINGS
from memrl_bench.environments.mysql.address import ServerAddress, is_reachable
from memrl_cli.errors import MemrlError

_START_TIMEOUT = 60.0
_STOP_TIMEOUT = 30.0
_SEARCH_DIRS = ("/usr/sbin", "/usr/local/sbin", "/sbin", "/usr/libexec", "/usr/local/mysql/bin")
INSTALL_HINT = (
    "no MySQL-compatible server available: install MariaDB (`apt-get install mariadb-server`), "
    "start a Docker daemon, or pass `--option mysql_url=mysql://user:password@host:port`"
)
_started_here: dict[int, subprocess.Popen] = {}  # servers this process started (and must reap), by pid


def find_mariadb() -> tuple[str, str] | None:
    """Paths of `mariadbd` and `mariadb-install-db`, or None when MariaDB is not installed."""
    search_path = os.pathsep.join([os.environ.get("PATH", ""), *_SEARCH_DIRS])
    server = shutil.which("mariadbd", path=search_path)
    installer = shutil.which("mariadb-install-db", path=search_path)
    return (server, installer) if server and installer else None


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists and has not exited (a zombie has)."""
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


def start() -> dict[str, Any]:
    """Start a MariaDB server; its record: kind "mariadb", pid, root (its directory), address."""
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
         "--skip-test-db", *as_root, *INNODB_SETTINGS],
        capture_output=True, text=True, timeout=120,
    )
    if install.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise MemrlError(f"mariadb-install-db failed: {(install.stderr or install.stdout).strip()[-300:]}")
    process = subprocess.Popen(
        [server, "--no-defaults", f"--datadir={datadir}", f"--socket={socket_path}", "--skip-networking",
         f"--pid-file={root / 'mysqld.pid'}", f"--log-error={log}", *as_root,
         *SERVER_SETTINGS, *INNODB_SETTINGS],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,  # outlives the process that started it; the last user stops it
    )
    address = ServerAddress(user="root", unix_socket=str(socket_path))
    deadline = time.monotonic() + _START_TIMEOUT
    while not (socket_path.exists() and is_reachable(address)):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            tail = log.read_text(errors="replace")[-400:] if log.exists() else ""
            shutil.rmtree(root, ignore_errors=True)
            raise MemrlError(f"MariaDB did not start: {tail.strip()}")
        time.sleep(0.1)
    _started_here[process.pid] = process
    return {"kind": "mariadb", "pid": process.pid, "root": str(root), "address": asdict(address)}


def _is_server_process(pid: int, root: str) -> bool:
    try:
        return root in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace") and pid_alive(pid)
    except OSError:
        return False


def stop(state: dict[str, Any]) -> None:
    """Stop the server of record `state` (SIGTERM, SIGKILL after `_STOP_TIMEOUT`) and delete its directory."""
    pid = state["pid"]
    if _is_server_process(pid, state["root"]):  # else gone already, and its pid possibly reused
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_TIMEOUT
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    process = _started_here.pop(pid, None)
    if process is not None:  # started by this process: reap it
        process.wait()
    shutil.rmtree(state["root"], ignore_errors=True)


os.register_at_fork(after_in_child=_started_here.clear)  # a child did not start its parent's servers
