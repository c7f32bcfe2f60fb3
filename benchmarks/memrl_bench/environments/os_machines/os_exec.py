"""Running one script in a running LLB OS machine from the host, with a time limit and captured output.

`enter_command` is the host command that runs a script inside the machine through
`os_enter.py` (its cgroups, rlimits and namespaces, Docker's default capabilities minus
CAP_MKNOD, and for the check its world: the pristine image, the agent's state as data); `start_agent_namespace`
starts the PID namespace the agent's scripts run in; `run_captured` runs a
host command with a time limit, keeps at most `MAX_CAPTURED_BYTES` of its output, and kills
its process group when the time is up.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from memrl_bench.environments.os_machines.os_cgroup import Cgroup
from memrl_bench.environments.os_machines.os_machine import MAX_CAPTURED_BYTES, SANDBOX_PATH, CommandResult, SandboxError

TRUSTED_PATH = "/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin:/usr/local/bin"  # the agent's tools last
# The check's interpreters read no start-up file of the agent's: Python neither its user site
# (~/.local: usercustomize, .pth) nor the working directory ("/", the agent's) as first import path.
TRUSTED_ENV = ("PYTHONNOUSERSITE=1", "PYTHONSAFEPATH=1")
# Docker's default capability set, minus MKNOD (a root process with CAP_MKNOD could create
# and open the host's block devices, since there is no device cgroup here): chown, dac_override,
# fowner, fsetid, kill, setgid, setuid, setpcap, net_bind_service, net_raw, sys_chroot, setfcap,
# audit_write, as capability numbers (linux/capability.h) for `os_enter.py`.
_KEPT_CAPABILITY_NUMBERS = "0,1,3,4,5,6,7,8,10,13,18,29,31"
ENTER_SCRIPT = Path(__file__).with_name("os_enter.py")
_DRAIN_SECONDS = 0.2


def enter_command(pid: int, rlimits: dict[str, int], cgroup: Cgroup | None, trusted: bool, script: str) -> list[str]:
    """The host command running `script` with `bash -c` in the namespaces of `pid` (`benchmarks/memrl_bench/environments/os_machines/os_enter.py`).

    It joins `cgroup`, sets `rlimits` and keeps only Docker's default capabilities minus MKNOD
    (`_KEPT_CAPABILITY_NUMBERS`); `trusted` (the check) runs it with `bash -p` in the check's
    world (`os_check_view`: the pristine image at `PRISTINE`, the agent's state as data) and
    credentials (`os_check_guard`, which `-p` keeps).
    """
    return [
        sys.executable, "-I", "-S", str(ENTER_SCRIPT), str(pid), _KEPT_CAPABILITY_NUMBERS,
        json.dumps(rlimits), json.dumps(cgroup.procs_files() if cgroup else []),
        "trusted" if trusted else "untrusted", "--",
        "/usr/bin/env", "-i", f"PATH={TRUSTED_PATH if trusted else SANDBOX_PATH}", "HOME=/root", "USER=root",
        "LOGNAME=root", *(TRUSTED_ENV if trusted else ()), "/usr/bin/bash", *(("-p",) if trusted else ()), "-c", script,
    ]


def start_agent_namespace(pid: int, cgroup: Cgroup | None) -> int:
    """Start the PID namespace the agent's scripts run in, inside that of the machine whose first
    process is `pid` (`os_enter.py nest`); the host PID of its first process, which scripts enter.

    The check enters `pid` instead: it sees the agent's processes, none of which can reach it.
    """
    command = [sys.executable, "-I", "-S", str(ENTER_SCRIPT), str(pid), "", "{}",
               json.dumps(cgroup.procs_files() if cgroup else []), "nest", "--"]
    started = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    if started.returncode != 0 or not started.stdout.strip().isdigit():
        said = [line for line in started.stderr.splitlines() if line.startswith("memrl: ")]
        raise SandboxError(" ".join(said)[:300] or f"could not start the agent's namespace: {started.stderr[-300:]}")
    return int(started.stdout)


def run_captured(command: list[str], timeout: float) -> CommandResult:
    """Run `command` with a time limit, capturing stdout+stderr.

    Returns when the command exits, even if background processes it started still hold
    its output open (their later output is dropped, as with `docker exec`). On timeout the
    command's process group is killed.
    """
    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    assert process.stdout is not None
    stream = process.stdout.fileno()
    os.set_blocking(stream, False)
    chunks = bytearray()
    deadline = time.monotonic() + timeout
    drain_until: float | None = None
    open_stream = True
    try:
        while True:
            now = time.monotonic()
            if drain_until is None and process.poll() is not None:
                drain_until = now + _DRAIN_SECONDS
            if drain_until is not None and (now > drain_until or not open_stream):
                return CommandResult(exit_code=process.returncode, output=decode(chunks), timed_out=False)
            if drain_until is None and now > deadline:
                _kill_group(process)
                return CommandResult(exit_code=None, output=decode(chunks), timed_out=True)
            if not open_stream:
                time.sleep(0.02)
                continue
            ready, _, _ = select.select([stream], [], [], 0.05)
            if not ready:
                continue
            data = os.read(stream, 65536)
            if not data:
                open_stream = False
            elif len(chunks) < MAX_CAPTURED_BYTES:
                chunks += data[: MAX_CAPTURED_BYTES - len(chunks)]
    finally:
        process.stdout.close()


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """Kill a timed-out script and everything in its process group."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def decode(data: bytes | bytearray) -> str:
    """A script's output as text (invalid UTF-8 replaced)."""
    return bytes(data).decode("utf-8", errors="replace")
