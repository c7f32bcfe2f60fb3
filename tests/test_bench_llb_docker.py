"""The LLB Docker backends on a real Docker daemon: images, limits, cleanup, ground truths.

The images are built on first use (`memrl_bench.environments.docker_images`: debootstrap + `docker import`;
~5 min cold for llb-db, seconds once cached). The LLB-DB and LLB-OS ground-truth cases of
tests/test_bench_llb_db.py and tests/test_bench_llb_os.py run here through the Docker
backends. Without a Docker daemon these tests skip with the reason, except under CI (`CI`
set), where `.ci/run` starts one and they fail instead.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import bench_data
import pytest
from benchmarks.testing.chat_server import ScriptedChatServer
from conftest import under_ci
from test_bench_llb_db import TIE_ORDER_IDS, _ground_truth_agent, _sample_tasks
from test_bench_llb_os import (CHECK_ATTACKS, LIMITED, bash, client_for, expected_limit_statuses, finish, limit_statuses,
                                scripted)

from memrl_bench.environments import docker_images
from memrl_bench.environments.mysql import mysql8_compat
from memrl_bench.environments.mysql import server as mysql_server
from benchmarks.testing import hostile
from memrl_bench.adapters.llb_db.benchmark import SPLIT_FILES as DB_SPLITS
from memrl_bench.adapters.llb_db.benchmark import LLBDatabase
from memrl_bench.adapters.llb_os.benchmark import CORRECT, INCORRECT, LLBOperatingSystem
from memrl_bench.environments.os_machines.os_docker import DockerSandbox
from memrl_bench.environments.os_machines.os_sandbox import SandboxFactory
from memrl_cli.errors import MemrlError

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # building the images takes minutes; the tests then reuse them
DATA = bench_data.directory("llb", "db_val.json")  # where the tool finds it, else the developers' copy


def _unavailable(reason: str) -> None:
    if under_ci():
        pytest.fail(f"Docker is required under CI: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def client() -> Any:
    """A client of the Docker daemon, with both images built."""
    try:
        found = docker_images.require_docker()
    except MemrlError as exc:
        _unavailable(str(exc))
    if not (DATA / "db_val.json").is_file():
        bench_data.unavailable("llb", DATA)
    try:
        for name in docker_images.IMAGES:
            docker_images.ensure_image(found, name)
    except MemrlError as exc:
        _unavailable(f"the Docker images cannot be built here: {exc}")
    return found


def _containers(client: Any) -> list[str]:
    """Ids of the containers memrl's backends made (running or not)."""
    labels = ("memrl.sandbox", "memrl.server")
    return [found["Id"] for label in labels for found in client.api.containers(all=True, filters={"label": label})]


@pytest.fixture(scope="module")
def db_adapter(client: Any) -> Iterator[LLBDatabase]:
    """An llb-db adapter on the Docker server, with a state directory of its own (so its own server)."""
    patch = pytest.MonkeyPatch()
    patch.setattr(tempfile, "tempdir", tempfile.mkdtemp(prefix="memrl-docker-test-"))
    bench = LLBDatabase(data=str(DATA), server="docker")
    yield bench
    bench.close()
    patch.undo()


# --------------------------------------------------------------------------- no daemon needed


def test_no_daemon_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(MemrlError, match=r"no Docker daemon answers .*dockerd"):
        SandboxFactory(backend="docker").resolve()
    with pytest.raises(MemrlError, match=r"no Docker daemon answers .*dockerd"):
        mysql_server.acquire("docker")
    assert docker_images.docker_client() is None


def test_image_tags_follow_the_contents() -> None:
    spec = docker_images.IMAGES["llb-os"]
    assert spec.tag == docker_images.IMAGES["llb-os"].tag and spec.tag.startswith("memrl/llb-os:")
    changed = docker_images.ImageSpec("llb-os", (*spec.packages, "curl"), spec.changes)
    assert changed.tag != spec.tag and changed.tag.startswith("memrl/llb-os:")
    assert docker_images.IMAGES["llb-db"].rootfs != spec.rootfs


# --------------------------------------------------------------------------- images


def test_images_are_cached_and_labelled(client: Any) -> None:
    for name, spec in docker_images.IMAGES.items():
        started = time.monotonic()
        assert docker_images.ensure_image(client, name) == spec.tag
        assert time.monotonic() - started < 5  # cached: no rebuild
        labels = client.images.get(spec.tag).labels
        assert labels == {"memrl.image": name, "memrl.version": spec.tag.split(":")[1]}


# --------------------------------------------------------------------------- llb-os sandbox


@pytest.mark.slow
def test_sandbox_keeps_state_and_kills_timeouts(client: Any) -> None:
    sandbox = DockerSandbox(client, docker_images.IMAGES["llb-os"].tag, timeout=3)
    try:
        first = sandbox.run("cd /tmp && export FOO=1 && touch made && id -u && hostname")
        assert (first.exit_code, first.output) == (0, "0\nllb-os\n")
        second = sandbox.run('pwd; echo "FOO=$FOO"; ls /tmp; exit 3')
        assert (second.exit_code, second.output) == (3, "/\nFOO=\nmade\n")  # new shell, same files
        started = sandbox.run("(sleep 300 &); echo started")  # a background process outlives its script
        assert started.output == "started\n" and not started.timed_out
        assert "sleep 300" in sandbox.run("ps -eo args").output  # and does not block later scripts
        began = time.monotonic()
        slow = sandbox.run("echo partial; sleep 31")
        assert slow.timed_out and slow.exit_code is None and slow.output == "partial\n"
        assert time.monotonic() - began < 8
        assert "sleep 31" not in sandbox.run("ps -eo args").output  # killed
    finally:
        sandbox.close()
    assert sandbox.id not in _containers(client)


@pytest.mark.slow
def test_sandbox_has_no_network_and_its_limits(client: Any) -> None:
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen()
    port = listener.getsockname()[1]
    connections: list[object] = []

    def accept() -> None:
        while True:
            try:
                connections.append(listener.accept())
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    sandbox = DockerSandbox(client, docker_images.IMAGES["llb-os"].tag, timeout=20, memory_mb=256, nproc=64,
                            cpu_seconds=2)
    try:
        attrs = client.api.inspect_container(sandbox.id)["HostConfig"]
        assert attrs["NetworkMode"] == "none" and attrs["Memory"] == 256 << 20 and attrs["PidsLimit"] == 64
        assert attrs["NanoCpus"] == 1_000_000_000 and "MKNOD" in attrs["CapDrop"]
        interfaces = sandbox.run("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '").output.split()
        assert interfaces == ["lo"]
        gateway = "172.17.0.1"  # Docker's default bridge on the host
        reach = sandbox.run(f"echo hi > /dev/tcp/{gateway}/{port}; echo tcp=$?; "
                            f"python3 -c 'import socket; socket.create_connection((\"{gateway}\", {port}), 2)' "
                            "2>/dev/null; echo py=$?")
        assert "tcp=1" in reach.output and "py=1" in reach.output
        hog = sandbox.run("python3 -c 'x = bytearray(600 << 20); print(len(x))'; echo exit=$?")
        assert "exit=137" in hog.output  # killed by the memory cgroup
        spin = sandbox.run("python3 -c 'while True: pass'; echo exit=$?")
        assert "exit=152" in spin.output and not spin.timed_out  # SIGXCPU after cpu_seconds
        assert sandbox.run("ulimit -St; ulimit -Ht; ulimit -c").output.split() == ["2", "3", "0"]
        bomb = "import os, time\nfor n in range(200):\n    if os.fork() == 0:\n        time.sleep(30)\n        os._exit(0)"
        forks = sandbox.run(f"python3 -c '{bomb}' >/tmp/bomb 2>&1; tail -n 1 /tmp/bomb; ps -e --no-headers | wc -l")
        assert "BlockingIOError" in forks.output and int(forks.output.split()[-1]) <= 64  # the pids cgroup said no
    finally:
        sandbox.close()
        listener.close()
    assert connections == []


@pytest.mark.slow
def test_os_ground_truth_agent_is_correct_and_idle_agent_is_not(client: Any) -> None:
    """The scripted ground-truth episodes of test_bench_llb_os, through the Docker backend."""
    adapter = LLBOperatingSystem(data=str(DATA), backend="docker", command_timeout=10, keep_weak_checks=True)
    assert adapter.sandboxes.resolve() == "docker"
    # os/11 writes a script into /usr/bin that its check runs: the trusted check must see it (a weak check, left
    # out of the benchmark, played here).
    train = {"os/0", "os/1", "os/2", "os/11"}
    tasks = [task for task in adapter.tasks("train") if task.id in train] + adapter.tasks("val")[:2]
    with ScriptedChatServer(scripted({task.query: [bash(task.payload["ground_truth"]), finish()] for task in tasks})) \
            as server:
        episodes = [adapter.run_episode(task, [], client_for(server)) for task in tasks]
    for task, episode in zip(tasks, episodes):
        assert (episode.success, episode.status, episode.steps) == (True, CORRECT, 2), (task.id, episode)
    with ScriptedChatServer(scripted({task.query: [finish()] for task in tasks})) as server:
        idle = [adapter.run_episode(task, [], client_for(server)) for task in tasks]
    assert [(e.success, e.status) for e in idle] == [(False, INCORRECT)] * len(tasks)
    assert hostile.sandbox_containers() == []  # every episode removed its container


@pytest.mark.slow
def test_os_ground_truth_checks_through_docker(client: Any) -> None:
    """`benchmarks.perf.llb_os_ground_truth` on the first 6 samples of each split."""
    from benchmarks.perf.llb_os_ground_truth import check_task

    adapter = LLBOperatingSystem(data=str(DATA), backend="docker", limit=6)
    tasks = adapter.tasks("train") + adapter.tasks("val")
    results = {task.id: check_task(adapter.sandboxes, task) for task in tasks}
    assert {key: detail for key, (ok, discriminates, detail) in results.items() if not (ok and discriminates)} == {}


@pytest.mark.slow
def test_each_limit_ends_the_episode_with_its_status(client: Any) -> None:
    """Memory, processes, CPU time and disk: the per-episode status, as on the bwrap backend."""
    adapter = LLBOperatingSystem(data=str(DATA), backend="docker", **LIMITED)
    assert limit_statuses(adapter) == expected_limit_statuses()


def test_the_check_runs_with_the_images_tools_not_the_agents(client: Any) -> None:
    """The agent replaces the tools and the loader's preload list; the check still sees the truth."""
    sandbox = SandboxFactory(backend="docker", timeout=10).create()
    try:
        assert sandbox.untrusted_check is None
        forged = sandbox.run("printf '#!/bin/sh\\nexit 0\\n' > /usr/bin/grep; echo /tmp/evil.so > /etc/ld.so.preload;"
                             " mkdir -p /srv/agent; touch /srv/agent/made; grep -q nothing /etc/hostname")
        assert forged.exit_code == 0  # the agent's grep
        check = sandbox.run("grep -q nothing /etc/hostname", trusted=True)
        assert check.exit_code == 1 and "evil.so" not in check.output  # the image's grep, no preload
        assert sandbox.run("test -f /srv/agent/made && test ! -e /dev/.memrl-pristine && echo ok",
                           trusted=True).output == "ok\n"
        assert sandbox.run("cat /proc/self/status | grep CapEff", trusted=True).output.split()[1] == "00000000a00425fb"
        assert sandbox.run("touch /usr/bin/x", trusted=True).exit_code == 1  # read-only: the image's files
    finally:
        sandbox.close()
    assert sandbox.id not in _containers(client)


def test_an_untrusted_check_is_refused_unless_accepted(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without root beside the daemon the check would run with the agent's tools: a run stops with
    one line saying so, unless `untrusted_check` accepts it (then the episode records why)."""
    from memrl_bench.environments.os_machines import os_docker

    monkeypatch.setattr(os_docker.os, "geteuid", lambda: 1000)
    adapter = LLBOperatingSystem(data=str(DATA), backend="docker", command_timeout=10)
    task = adapter.tasks("train")[0]
    with pytest.raises(MemrlError, match="cannot be trusted.*needs root"):
        adapter.run_episode(task, [], None)  # type: ignore[arg-type]
    accepting = LLBOperatingSystem(data=str(DATA), backend="docker", command_timeout=10, untrusted_check=True)
    with ScriptedChatServer(scripted({task.query: [finish()]})) as server:
        episode = accepting.run_episode(task, [], client_for(server))
    assert not episode.success and "needs root" in episode.info["untrusted_check"]
    assert hostile.sandbox_containers() == []


@pytest.mark.parametrize("attack", list(CHECK_ATTACKS))
def test_the_agent_cannot_reach_the_check(client: Any, attack: str) -> None:
    """Links planted on the loader's start-up files, processes left running: neither reaches the check (Docker)."""
    sandbox = SandboxFactory(backend="docker", timeout=20).create()
    try:
        assert sandbox.untrusted_check is None
        CHECK_ATTACKS[attack](sandbox)
    finally:
        sandbox.close()
    assert sandbox.id not in _containers(client)


# --------------------------------------------------------------------------- llb-db server


def test_db_server_runs_in_a_limited_container_without_network(client: Any, db_adapter: LLBDatabase) -> None:
    address = db_adapter.address()
    record = mysql_server.running_server()
    assert record is not None and record["kind"] == "docker" and address.unix_socket
    attrs = client.api.inspect_container(record["container"])["HostConfig"]
    assert attrs["NetworkMode"] == "none" and attrs["Memory"] == 1 << 30 and attrs["PidsLimit"] == 1024
    connection = address.connect()
    with connection.cursor() as cursor:
        cursor.execute("SELECT VERSION(), @@skip_networking, @@sql_mode")
        version, no_network, sql_mode = cursor.fetchone()
    connection.close()
    assert "MariaDB" in version and no_network == 1 and sql_mode == mysql8_compat.MYSQL8_SQL_MODE


def test_db_ground_truth_episodes_through_docker(db_adapter: LLBDatabase) -> None:
    """The scripted ground-truth episodes of test_bench_llb_db, on the Docker server."""
    tasks = _sample_tasks(db_adapter, "md5", 4) + _sample_tasks(db_adapter, "direct", 4)
    with ScriptedChatServer(_ground_truth_agent(tasks)) as server:
        llm = client_for(server)
        episodes = [db_adapter.run_episode(task, [], llm) for task in tasks]
    assert [e.status for e in episodes] == ["CORRECT"] * len(tasks), [e.info for e in episodes]


@pytest.mark.slow
def test_db_ground_truths_reproduce_through_docker(db_adapter: LLBDatabase) -> None:
    """All 500 ground truths, graded as episodes, as `test_ground_truths_reproduce_on_mariadb` does."""
    from benchmarks.perf.llb_db_ground_truth import reproduce

    tasks = [task for split in DB_SPLITS for task in db_adapter.tasks(split)]
    failed = {task.id for task in tasks if not reproduce(db_adapter, task)[0]}
    assert failed <= TIE_ORDER_IDS, sorted(failed - TIE_ORDER_IDS)
    assert len(tasks) - len(failed) >= 490


# --------------------------------------------------------------------------- no container left behind

_INTERRUPTED_RUN = """
import json, sys, time
from memrl_bench.environments.mysql import server as mysql_server
from memrl_bench.environments.os_machines.os_sandbox import SandboxFactory
mysql_server.acquire("docker")
sandbox = SandboxFactory(backend="docker").create()
sandbox.run("(sleep 300 &); true")
print(json.dumps([mysql_server.running_server()["container"], sandbox.id]), flush=True)
try:
    time.sleep(300)
finally:
    if sys.argv[1] == "closes":
        sandbox.close()
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["ctrl-c", "sigterm", "sigkill"])
def test_no_container_outlives_an_interrupted_run(client: Any, how: signal.Signals) -> None:
    short = Path(tempfile.mkdtemp(prefix="m", dir="/tmp"))  # the server's socket path must fit a Unix socket
    try:
        env = {**os.environ, "TMPDIR": str(short), "PYTHONPATH": str(REPO)}
        closes = "closes" if how == signal.SIGINT else "dies"  # Ctrl-C unwinds through `finally`; signals do not
        process = subprocess.Popen([sys.executable, "-c", _INTERRUPTED_RUN, closes], cwd=REPO, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, process.stderr.read() if process.stderr else ""
        containers = set(json.loads(line))
        assert containers <= set(_containers(client))
        process.send_signal(how)
        process.wait(timeout=120)
        deadline = time.monotonic() + 60
        while containers & set(_containers(client)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not containers & set(_containers(client)), process.stderr.read() if process.stderr else ""
    finally:
        shutil.rmtree(short, ignore_errors=True)
