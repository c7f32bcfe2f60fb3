"""The LLB OS machine without Docker: a fresh overlay of the Debian rootfs in namespaces of its own.

`BwrapSandbox` mounts, per sample, an overlay (the rootfs from `os_rootfs.ensure_rootfs` as
read-only lower layer, a temporary upper layer on a tmpfs of `disk_mb`) in a private mount
namespace and enters it with `bwrap` (new pid/net/ipc/uts namespaces, own /proc and /dev, no
network). One long-lived bwrap process per sample holds the namespaces; each script enters them
from the host (`os_exec.enter_command`, `os_enter.py`), so a background process started by one
script is still there for the next one and for the check. The agent's scripts run in a PID
namespace inside the sandbox's (`os_exec.start_agent_namespace`), the check in the sandbox's own:
it sees the agent's processes, they cannot reach it. Scripts run as root with Docker's
default capabilities minus CAP_MKNOD (no CAP_SYS_ADMIN: no mounting, no escaping the overlay),
in a cgroup of the sample's own (`os_cgroup`) where cgroups are writable.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from memrl_bench.environments.os_machines.os_cgroup import Cgroup
from memrl_bench.environments.os_machines.os_exec import enter_command, run_captured, start_agent_namespace
from memrl_bench.environments.os_machines.os_machine import (PRISTINE, SANDBOX_HOSTNAME, CommandResult, Limits, SandboxError,
                                                 reported_limit)
from memrl_bench.environments.os_machines.os_rootfs import INSTALL_HINT
from memrl_cli.errors import MemrlError

_START_SECONDS = 30.0  # how long bwrap may take to start the sandbox


def check_bwrap_tools() -> None:
    """Raise MemrlError unless the host can run `BwrapSandbox` (root, bwrap, unshare, nsenter)."""
    missing = [tool for tool in ("bwrap", "unshare", "nsenter", "mount") if shutil.which(tool) is None]
    if missing:
        raise MemrlError(f"{', '.join(missing)} missing for the LLB OS sandbox; {INSTALL_HINT}")
    if os.geteuid() != 0:
        raise MemrlError(
            "the LLB OS sandbox without Docker mounts an overlay and needs root; run as root or use Docker"
        )


class BwrapSandbox:
    """A fresh overlay of `rootfs` in its own namespaces; see the module docstring."""

    def __init__(self, rootfs: Path, timeout: float, limits: Limits = Limits()) -> None:
        check_bwrap_tools()
        self.timeout = float(timeout)
        self.limits = limits
        self._dir = Path(tempfile.mkdtemp(prefix="memrl-llb-os-"))
        self._process: subprocess.Popen[bytes] | None = None
        self._cgroup = Cgroup.create(self._dir.name, limits)
        self._out_of_memory = False  # a script reported running out of memory (the address-space limit)
        try:
            self._pid = self._start(Path(rootfs))
            self._agent_pid = start_agent_namespace(self._pid, self._cgroup)
        except BaseException:
            self.close()
            raise

    def _start(self, rootfs: Path) -> int:
        layers, merged = self._dir / "layers", self._dir / "merged"
        for directory in (layers, merged):
            directory.mkdir()
        options = f"lowerdir={rootfs},upperdir={layers}/upper,workdir={layers}/work"
        read_fd, write_fd = os.pipe()
        bwrap = [
            "bwrap", "--bind", str(merged), "/", "--proc", "/proc", "--dev", "/dev", "--ro-bind", str(rootfs), PRISTINE,
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--hostname", SANDBOX_HOSTNAME,
            "--die-with-parent", "--chdir", "/", "--info-fd", str(write_fd),
            "--", "/bin/sh", "-c", "echo ready && exec cat",
        ]
        # The overlay is mounted inside a private mount namespace, so it can never outlive
        # the sandbox. The sandbox's first process says "ready", then `cat` reads a pipe only
        # this process writes to: when this process dies, for any reason, `cat` sees EOF and
        # exits, bwrap (pid 1 inside) follows, and the kernel kills the whole pid namespace.
        # The writable layer lives on a tmpfs of `disk_mb` in that namespace: the disk limit.
        shell = ('for f in $4; do echo $$ > "$f" || exit 1; done; '
                 'mount -t tmpfs -o "size=$3m,mode=0700" tmpfs "$5" && mkdir "$5/upper" "$5/work" && '
                 'mount -t overlay overlay -o "$1" "$2" && shift 5 && exec "$@"')
        cgroups = " ".join(self._cgroup.procs_files()) if self._cgroup else ""
        try:
            self._process = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c", shell, "sh", options, str(merged),
                 str(self.limits.disk_mb), cgroups, str(layers), *bwrap],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(write_fd,),
            )
        finally:
            os.close(write_fd)
        info = _read_info(read_fd, _START_SECONDS)
        assert self._process.stdout is not None
        ready = select.select([self._process.stdout], [], [], _START_SECONDS)[0]
        if info is None or not ready or self._process.stdout.readline() != b"ready\n":
            stderr = b""
            if self._process.poll() is not None and self._process.stderr is not None:
                stderr = self._process.stderr.read()
            reason = stderr.decode(errors="replace").strip() or "no reply from bwrap"
            raise SandboxError(f"could not start the LLB OS sandbox: {reason}")
        return int(info["child-pid"])

    def run(self, script: str, trusted: bool = False) -> CommandResult:
        """Run `script` in the sandbox's namespaces, cgroups and rlimits (see `benchmarks/memrl_bench/environments/os_machines/os_enter.py`).

        `trusted` (for the check that grades the episode) runs it in the check's world: the
        pristine rootfs with the agent's state as data (`os_check_view`), out of reach of any
        program of the agent's it runs (`os_check_guard`).
        """
        if self._process is None or self._process.poll() is not None:
            raise SandboxError("the LLB OS sandbox is no longer running")
        target = self._pid if trusted else self._agent_pid  # the check: beyond the reach of the agent's processes
        command = enter_command(target, self.limits.rlimits(), self._cgroup, trusted, script)
        result = run_captured(command, self.timeout)
        if reported_limit(result) == "memory":
            self._out_of_memory = True
        return result

    def limit_hit(self) -> str | None:
        """Which limit the sandbox ran into so far: "memory", "processes", "disk" or None."""
        if self._out_of_memory:
            return "memory"
        if self._cgroup is not None:
            hit = self._cgroup.limit_hit()
            if hit:
                return hit
        if self._process is not None and self._process.poll() is None:
            usage = subprocess.run(["nsenter", f"--target={self._process.pid}", "--mount", "stat", "-f", "-c", "%a %S",
                                    str(self._dir / "layers")], capture_output=True, text=True, timeout=10)
            free_blocks, block = (int(x) for x in (usage.stdout.split() or ["1", "0"]))
            if usage.returncode == 0 and free_blocks * block < 1024 * 1024:
                return "disk"
        return None

    def close(self) -> None:
        """Kill the sandbox's processes (the whole pid namespace) and delete the overlay."""
        if self._process is not None:
            for stream in (self._process.stdin, self._process.stdout, self._process.stderr):
                if stream is not None:
                    stream.close()  # closing stdin ends `cat`, hence the sandbox's pid namespace
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()  # bwrap's child (pid 1 inside) dies with it
                self._process.wait()
            self._process = None
        if self._cgroup is not None:
            self._cgroup.remove()
            self._cgroup = None
        for _ in range(50):
            shutil.rmtree(self._dir, ignore_errors=True)
            if not self._dir.exists():
                return
            time.sleep(0.1)


def _read_info(fd: int, timeout: float) -> dict[str, Any] | None:
    """Read the JSON object bwrap writes to --info-fd once the sandbox is up (None if it never comes)."""
    buffer = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            data = os.read(fd, 4096)
            if not data:
                return None
            buffer += data
            try:
                return json.loads(buffer)
            except json.JSONDecodeError:
                continue
        return None
    finally:
        os.close(fd)
