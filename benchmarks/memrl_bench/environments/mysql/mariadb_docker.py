"""A MariaDB server in a Docker container (memrl's `llb-db` image), without network, reachable by a Unix socket.

`start` runs the container with a private host directory as its run directory (socket, logs,
`users.lock`) and a tmpfs as its data directory, inside memory, process and CPU limits; it
returns the server's record for `mysql_server`. Every process using the server holds a shared
lock on `users.lock` (`hold_users_lock`); the container stops itself once nobody holds it, so
it goes away even when all its users are killed. `stop` removes it and its run directory.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from memrl_bench.environments.docker_images import docker_client, ensure_image
from memrl_bench.environments.mysql.mysql8_compat import INNODB_SETTINGS, SERVER_SETTINGS
from memrl_bench.environments.mysql.address import ServerAddress, is_reachable
from memrl_cli.errors import MemrlError

_START_TIMEOUT = 120.0
_STOP_TIMEOUT = 30.0
# Limits of the Docker server: the data directory is a tmpfs inside the memory limit; every
# connection is a thread (max-connections 500).
_DOCKER_LIMITS = {"mem_limit": 1 << 30, "memswap_limit": 1 << 30, "pids_limit": 1024, "nano_cpus": 2_000_000_000}
_DOCKER_DATA_SIZE = "512m"
_DOCKER_RUN = "/run/memrl"  # where the container sees its private host directory (socket, logs, users.lock)
# The Docker server's first process: initialise a data directory on the tmpfs, start mariadbd
# on a socket in the host directory, then stop it as soon as no process holds a shared lock on
# users.lock. Every process using the server holds one (`hold_users_lock`) and the kernel drops
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

_SOCKET_PATH_MAX = 107  # sockaddr_un.sun_path on Linux, less its terminating NUL


def start(client: Any, directory: Path) -> dict[str, Any]:
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
    hold_users_lock(str(run / "users.lock"))  # before the container starts watching it
    script = _DOCKER_SERVER_SCRIPT.format(run=_DOCKER_RUN, settings=" ".join(SERVER_SETTINGS),
                                          innodb=" ".join(INNODB_SETTINGS))
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
    deadline = time.monotonic() + _START_TIMEOUT
    while not ((run / "mysqld.sock").exists() and is_reachable(address)):
        try:
            container.reload()
            running = container.status in ("created", "running")
        except docker.errors.NotFound:  # exited, and auto-removed
            running = False
        if not running or time.monotonic() > deadline:
            logs = " ".join((run / name).read_text(errors="replace")[-300:] for name in ("install.log", "error.log")
                            if (run / name).exists())
            stop(state)
            raise MemrlError(f"the MariaDB container from {image} did not start: {logs.strip() or 'no log'}")
        time.sleep(0.2)
    return state


def stop(state: dict[str, Any]) -> None:
    """Remove the container of record `state` and its run directory."""
    client = docker_client()
    if client is not None:
        _remove_container(client, state["container"])
    shutil.rmtree(state["run"], ignore_errors=True)


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


_users_lock: tuple[str, int] | None = None  # (path, fd) of the Docker server's users.lock this process holds


def hold_users_lock(path: str) -> None:
    """Hold a shared lock on a Docker server's users.lock until `drop_users_lock` or process exit.

    Waits while the server's container holds it exclusively: then it is stopping, and the
    caller sees it unreachable once the lock comes.
    """
    global _users_lock
    if _users_lock is not None and _users_lock[0] == path:
        return
    drop_users_lock()
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


def drop_users_lock() -> None:
    """Release this process's lock on a Docker server's users.lock, if it holds one."""
    global _users_lock
    if _users_lock is not None:
        os.close(_users_lock[1])
        _users_lock = None


# A child's copy is its parent's lock: closing the copy leaves the parent's lock in place.
os.register_at_fork(after_in_child=drop_users_lock)
