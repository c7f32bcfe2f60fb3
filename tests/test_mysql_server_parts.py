"""The LLB-DB server's parts, each alone (`memrl_bench.environments`): a local MariaDB started and
stopped (`mariadb_local`), the Docker server's users lock (`mariadb_docker`), and the shared
server's registry of users (`mysql_server`). The address and the MySQL 8 rewrites are tested in
tests/test_bench_llb_db.py, the Docker server in tests/test_bench_llb_docker.py.

MariaDB (`apt-get install mariadb-server`) must be installed; outside CI the server tests skip
when it is not.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("pymysql", reason="the llb extra is not installed: pip install -e '.[llb]'")
from conftest import ROOT, unavailable  # noqa: E402

from memrl_bench.environments.mysql import mariadb_docker
from memrl_bench.environments.mysql import mariadb_local  # noqa: E402
from memrl_bench.environments.mysql.mysql8_compat import MYSQL8_SQL_MODE  # noqa: E402
from memrl_bench.environments.mysql.address import ServerAddress, is_reachable  # noqa: E402


def _require_mariadb() -> None:
    if mariadb_local.find_mariadb() is None:
        unavailable("MariaDB is not installed (apt-get install -y mariadb-server)", "MariaDB")


def test_pid_alive_tells_running_from_exited_and_zombie_processes() -> None:
    assert mariadb_local.pid_alive(os.getpid())
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 5
    while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.01)
    assert not mariadb_local.pid_alive(child.pid)  # exited, not yet reaped
    child.wait()
    assert not mariadb_local.pid_alive(child.pid)


def test_a_local_server_answers_with_mysql8_settings_and_stops_with_its_data() -> None:
    _require_mariadb()
    state = mariadb_local.start()
    try:
        assert state["kind"] == "mariadb" and mariadb_local.pid_alive(state["pid"])
        address = ServerAddress(**state["address"])
        assert address.unix_socket and Path(address.unix_socket).parent == Path(state["root"])
        connection = address.connect()
        with connection.cursor() as cursor:
            cursor.execute("SELECT @@sql_mode, @@skip_networking, @@character_set_server")
            assert cursor.fetchone() == (MYSQL8_SQL_MODE, 1, "utf8mb4")
        connection.close()
    finally:
        mariadb_local.stop(state)
    assert not mariadb_local.pid_alive(state["pid"]) and not Path(state["root"]).exists()
    assert not is_reachable(ServerAddress(**state["address"]))


def test_stop_leaves_alone_a_process_that_reused_the_server_s_pid(tmp_path: Path) -> None:
    stranger = subprocess.Popen(["sleep", "30"])
    try:
        mariadb_local.stop({"kind": "mariadb", "pid": stranger.pid, "root": str(tmp_path / "server")})
        assert stranger.poll() is None  # its command line does not name the server's directory
    finally:
        stranger.kill()
        stranger.wait()


def test_users_lock_is_shared_while_held_and_waits_for_a_stopping_server(tmp_path: Path) -> None:
    path = tmp_path / "users.lock"
    path.touch()

    def exclusive_possible() -> bool:  # the container's test: does anybody still use the server?
        with open(path) as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

    try:
        mariadb_docker.hold_users_lock(str(path))
        mariadb_docker.hold_users_lock(str(path))  # held already: a no-op
        assert not exclusive_possible()
        mariadb_docker.drop_users_lock()
        assert exclusive_possible()
        with open(path) as stopping:  # the container holds it exclusively while it stops
            fcntl.flock(stopping, fcntl.LOCK_EX)
            threading.Timer(0.3, fcntl.flock, (stopping, fcntl.LOCK_UN)).start()
            began = time.monotonic()
            mariadb_docker.hold_users_lock(str(path))
            assert time.monotonic() - began >= 0.25
        assert not exclusive_possible()
    finally:
        mariadb_docker.drop_users_lock()


# In a process of its own (the registry counts this process's acquisitions), with its own state
# directory: a stale record is cleaned up, users are counted, and the last release stops the server.
_REGISTRY = """
import json, os, sys, tempfile
from pathlib import Path
from memrl_bench.environments.mysql import server as mysql_server
from memrl_cli.errors import MemrlError

directory = mysql_server.state_dir()
stale = Path(tempfile.mkdtemp(prefix="stale-"))
dead = {"kind": "mariadb", "pid": int(sys.argv[1]), "root": str(stale),
        "address": {"user": "root", "unix_socket": str(stale / "mysqld.sock")}}
(directory / "server.json").write_text(json.dumps(dead))
try:
    mysql_server.acquire("bogus")
except MemrlError as exc:
    refused = str(exc)
first = mysql_server.acquire("mariadb")
record = mysql_server.running_server()
second = mysql_server.acquire("docker")  # a running server is reused whatever its kind
users = sorted(os.listdir(directory / "users"))
mysql_server.release()
still = mysql_server.running_server()
mysql_server.release()
print(json.dumps({"pid": os.getpid(), "refused": refused, "stale_left": stale.exists(), "record": record, "same": first == second,
                  "users": users, "still": still == record, "after": mysql_server.running_server()}))
"""


def test_the_registry_replaces_a_dead_server_and_the_last_release_stops_the_new_one(tmp_path: Path) -> None:
    _require_mariadb()
    dead = subprocess.Popen(["true"])
    dead.wait()
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # its own state directory, so its own server
    done = subprocess.run([sys.executable, "-c", _REGISTRY, str(dead.pid)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert "unknown server kind 'bogus'" in result["refused"]
    assert result["stale_left"] is False  # the dead server's directory was cleaned up
    record = result["record"]
    assert record["kind"] == "mariadb" and record["pid"] != dead.pid
    assert result["same"] and result["still"] and result["users"] == [str(result["pid"])]  # one user, counted once
    assert result["after"] is None
    assert not Path(record["root"]).exists() and not mariadb_local.pid_alive(record["pid"])
