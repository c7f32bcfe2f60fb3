"""The LLB OS machine's parts, each alone (`memrl_bench.environments.os_*`): what a script's result
reports, the rootfs's finished marker, the cgroup that caps a sample, and running a script from the
host (`os_exec`: time limit, capped output, entering a process's namespaces through `os_enter.py`).

The sandboxes they make up are tested in tests/test_bench_llb_os.py (bwrap) and
tests/test_bench_llb_docker.py (Docker). The cgroup and entering tests need root and writable
cgroups; outside CI they skip without them.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import unavailable

from memrl_bench.environments.os_machines import os_check_view
from memrl_bench.environments.os_machines.os_cgroup import Cgroup
from memrl_bench.environments.os_machines.os_check_guard import seccomp_program
from memrl_bench.environments.os_machines.os_check_view import named_paths
from memrl_bench.environments.os_machines.os_exec import enter_command, run_captured
from memrl_bench.environments.os_machines.os_machine import (MAX_CAPTURED_BYTES, PRISTINE, SANDBOX_PATH, CommandResult, Limits,
                                                 reported_limit)
from memrl_bench.environments.os_machines.os_rootfs import EXTRA_PACKAGES, ROOTFS_MARKER, default_rootfs_path, ensure_rootfs, rootfs_ready

KEPT_CAPABILITIES_MASK = "00000000a00425fb"  # Docker's default set minus MKNOD, as /proc/*/status shows it
# Forks until the cgroup refuses, then waits for its children (none is left behind in the cgroup).
FORK_BOMB = """import os, time
children = []
try:
    for n in range(20):
        child = os.fork()
        if child == 0:
            time.sleep(0.5)
            os._exit(0)
        children.append(child)
finally:
    for child in children:
        os.waitpid(child, 0)
"""


def _gone(pid: int) -> bool:
    """Whether `pid` no longer runs (exited, or a zombie nobody reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


@pytest.fixture
def cgroup() -> Iterator[Cgroup]:
    """A fresh cgroup of 64 MB (memory and disk) and 8 processes, removed afterwards."""
    if os.geteuid() != 0:
        unavailable("cgroups and entering namespaces need root", "root")
    made = Cgroup.create(f"memrl-test-{uuid.uuid4().hex[:12]}", Limits(memory_mb=48, nproc=8, disk_mb=16))
    if made is None:
        unavailable("the cgroups are not writable here", "writable cgroups")
    yield made
    made.remove()
    assert not any(directory.exists() for directory in made.directories.values())


def _in_cgroup(cgroup: Cgroup, program: str) -> subprocess.CompletedProcess[str]:
    """Run Python `program` inside `cgroup` (joined before it starts, as the bwrap sandbox joins its own)."""
    join = 'for f in $1; do echo $$ > "$f"; done; shift; exec "$@"'
    return subprocess.run(["sh", "-c", join, "sh", " ".join(cgroup.procs_files()), "python3", "-c", program],
                          capture_output=True, text=True, timeout=60)


# --------------------------------------------------------------------------- os_machine, os_rootfs


def test_a_result_reports_the_memory_and_disk_limits_it_ran_into() -> None:
    assert reported_limit(CommandResult(1, "Traceback ...\nMemoryError\n", False)) == "memory"
    assert reported_limit(CommandResult(134, "terminate called after throwing 'std::bad_alloc'", False)) == "memory"
    assert reported_limit(CommandResult(153, "", False)) == "disk"  # SIGXFSZ
    assert reported_limit(CommandResult(1, "head: error writing '/big': No space left on device", False)) == "disk"
    assert reported_limit(CommandResult(1, "out of memory; No space left on device", False)) == "memory"
    assert reported_limit(CommandResult(0, "fine\n", False)) is None
    assert reported_limit(CommandResult(None, "", True)) is None
    assert Limits(memory_mb=2, nproc=5, cpu_seconds=3, disk_mb=4).rlimits() == {
        "as": 2 << 20, "cpu": 3, "fsize": 4 << 20, "core": 0}


def test_a_rootfs_is_ready_only_with_its_finished_marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_rootfs_path("sid") == tmp_path / "cache" / "memrl" / "rootfs-sid"
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    assert not rootfs_ready(rootfs)  # no marker: an interrupted or foreign directory
    (rootfs / ROOTFS_MARKER).write_text("{not json")
    assert not rootfs_ready(rootfs)
    (rootfs / ROOTFS_MARKER).write_text(json.dumps({"packages": ["vim"]}))
    assert not rootfs_ready(rootfs)  # built with other packages
    (rootfs / ROOTFS_MARKER).write_text(json.dumps({"packages": list(EXTRA_PACKAGES)}))
    assert rootfs_ready(rootfs) and not rootfs_ready(rootfs, ("vim",))
    assert ensure_rootfs(rootfs) == rootfs and sorted(os.listdir(rootfs)) == [ROOTFS_MARKER]  # nothing built


# --------------------------------------------------------------------------- os_check_view, os_check_guard


def test_the_paths_a_check_names_are_found() -> None:
    """What the check's world shows of the agent's state beyond its data trees: the paths the script
    names, `~` and `$HOME` being /root, up to a glob or an expansion; never a relative path."""
    script = ("grep -q x /etc/app.conf && [ -x ~/bin/run.sh ] && ls /var/log/app/*.log; f=\"$HOME/a b\"; "
              "cat /x/../etc/passwd /tmp/ 'relative/y' \"/backups/$day\"; grep -q PATH=$PATH:/usr/local/bin ~/.bashrc")
    assert named_paths(script) == ["/backups", "/etc/app.conf", "/etc/passwd", "/root/.bashrc", "/root/a",
                                   "/root/bin/run.sh", "/tmp", "/usr/local/bin", "/var/log/app"]
    assert named_paths("[ -f testdir/total ] && cd / && ls") == []
    assert os_check_view.PRISTINE == PRISTINE  # where the sandboxes show the image


def test_the_check_s_seccomp_filter_fails_ptrace_and_kills_other_abis() -> None:
    x86 = seccomp_program("x86_64")
    assert x86 is not None and seccomp_program("riscv64") is None
    assert x86[-2:] == [(0x06, 0, 0, 0x7FFF0000), (0x06, 0, 0, 0x00050001)]  # allow; else EPERM
    denied = [(index, step) for index, step in enumerate(x86) if step[0] == 0x15 and step[3] < 1000]
    assert sorted(step[3] for _, step in denied) == [101, 298, 310, 311, 438]  # ptrace ... perf_event_open
    assert all(index + 1 + step[1] == len(x86) - 1 for index, step in denied)  # each jumps to EPERM
    assert (0x35, 0, 1, 0x40000000) in x86 and x86.count((0x06, 0, 0, 0x80000000)) == 2  # x32, other arch: killed
    arm = seccomp_program("aarch64")
    assert arm is not None and sorted(step[3] for step in arm if step[0] == 0x15 and step[3] < 1000) == [
        117, 241, 270, 271, 438]


# --------------------------------------------------------------------------- os_exec.run_captured


def test_run_captured_returns_when_the_script_exits_though_a_background_process_holds_its_output(
        tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    began = time.monotonic()
    done = run_captured(["bash", "-c", f"echo hi; sleep 30 & echo $! > {pid_file}; echo bye >&2; exit 3"], 10)
    try:
        assert (done.exit_code, done.output, done.timed_out) == (3, "hi\nbye\n", False)
        assert time.monotonic() - began < 5
    finally:
        os.kill(int(pid_file.read_text()), 9)


def test_run_captured_kills_the_process_group_when_the_time_is_up(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    began = time.monotonic()
    done = run_captured(["bash", "-c", f"sleep 30 & echo $! > {pid_file}; echo partial; wait"], 1)
    assert (done.exit_code, done.output, done.timed_out) == (None, "partial\n", True)
    assert time.monotonic() - began < 5
    deadline = time.monotonic() + 5
    while not _gone(int(pid_file.read_text())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(int(pid_file.read_text()))  # the background process died with its script


def test_run_captured_keeps_at_most_its_cap_and_replaces_invalid_text() -> None:
    done = run_captured(["bash", "-c", "head -c 3M /dev/zero | tr '\\0' x; printf '\\377'"], 20)
    assert done.exit_code == 0 and len(done.output) == MAX_CAPTURED_BYTES and set(done.output) == {"x"}
    assert run_captured(["printf", "a\\377b"], 5).output == "a\ufffdb"


# --------------------------------------------------------------------------- os_cgroup, os_exec.enter_command


def test_a_cgroup_refuses_forks_beyond_its_processes_and_says_so(cgroup: Cgroup) -> None:
    settings = {path.name: path.read_text().strip() for directory in cgroup.directories.values()
                for path in directory.iterdir() if path.name in ("pids.max", "memory.max", "memory.limit_in_bytes")}
    assert settings["pids.max"] == "8" and (settings.get("memory.max") or settings["memory.limit_in_bytes"]) == str(64 << 20)
    assert cgroup.limit_hit() is None
    forks = _in_cgroup(cgroup, FORK_BOMB)
    assert "BlockingIOError" in forks.stderr and cgroup.limit_hit() == "processes"


def test_a_cgroup_kills_beyond_its_memory_and_says_so(cgroup: Cgroup) -> None:
    assert _in_cgroup(cgroup, "x = b'x' * (16 << 20)").returncode == 0 and cgroup.limit_hit() is None
    hog = _in_cgroup(cgroup, "x = b'x' * (200 << 20)")  # memory_mb + disk_mb is 64 MB
    assert hog.returncode == -9 and cgroup.limit_hit() == "memory"  # the OOM killer


def test_a_process_s_own_cgroups_are_found() -> None:
    own = Cgroup.of_process(os.getpid())
    assert own is not None and own.procs_files()
    assert all(str(os.getpid()) in Path(path).read_text().split() for path in own.procs_files())
    assert Cgroup.of_process(2 ** 22 + 1) is None  # no such process


def test_enter_command_runs_a_script_in_the_target_with_its_limits_and_fewer_capabilities(
        cgroup: Cgroup, tmp_path: Path) -> None:
    hostname = f"memrl-{uuid.uuid4().hex[:8]}"
    target = subprocess.Popen(["unshare", "--uts", "sh", "-c", f"hostname {hostname} && exec sleep 60"])
    try:
        deadline = time.monotonic() + 5
        while Path(f"/proc/{target.pid}/cmdline").read_bytes().split(b"\0")[0] != b"sleep":
            assert time.monotonic() < deadline, "the target did not start"
            time.sleep(0.02)
        limits = Limits(memory_mb=512, nproc=8, cpu_seconds=5, disk_mb=1)
        device = tmp_path / "device"  # the target shares this machine's files
        script = ('hostname; id -u; echo "$PATH"; grep CapEff /proc/self/status | cut -f2; ulimit -t; ulimit -f; '
                  f'ulimit -c; cat /proc/self/cgroup; mknod {device} b 8 0 2>/dev/null || echo no-mknod')
        done = run_captured(enter_command(target.pid, limits.rlimits(), cgroup, False, script), 10)
    finally:
        target.kill()
        target.wait()
    lines = done.output.splitlines()
    assert done.exit_code == 0, done.output
    assert lines[:7] == [hostname, "0", SANDBOX_PATH, KEPT_CAPABILITIES_MASK, "5", "1024", "0"]
    assert any(str(path.name) in done.output for path in cgroup.directories.values())  # in the sample's cgroup
    assert lines[-1] == "no-mknod" and not device.exists()
