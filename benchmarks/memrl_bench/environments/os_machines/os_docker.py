"""The LLB OS machine on Docker: a fresh container per sample, without network and with limits.

`DockerSandbox` runs memrl's Debian image (`docker_images`, the rootfs of `os_rootfs` loaded
with `docker import`, built on first use) or any image with `bash` and `cat`. Scripts enter the
container from the host (`os_exec.enter_command`), as in `BwrapSandbox`: the agent's in a PID
namespace inside the container's (`os_exec.start_agent_namespace`), the check in the container's
own, with the image's pristine tools. Without root on the daemon's machine, every script runs with
`docker exec bash -c SCRIPT`, as LLB does, and `untrusted_check` says why.
"""

from __future__ import annotations

import os
import select
import signal
import time
import uuid
from pathlib import Path
from typing import Any

from memrl_bench.environments.os_machines.os_cgroup import Cgroup
from memrl_bench.environments.os_machines.os_exec import decode, enter_command, run_captured, start_agent_namespace
from memrl_bench.environments.os_machines.os_machine import (MAX_CAPTURED_BYTES, PRISTINE, SANDBOX_HOSTNAME, CommandResult,
                                                 SandboxError, reported_limit)

# How DockerSandbox runs a script ($1), its output file ($2) and the output cap ($3).
_DOCKER_WRAPPER = 'bash -c "$1" >"$2" 2>&1; status=$?; head -c "$3" "$2"; rm -f "$2"; exit $status'


class DockerSandbox:
    """A fresh container per sample: no network, limits, removed at `close()` or if memrl dies.

    Limits: `memory_mb` of memory (no swap) and `nproc` processes/threads for the whole
    container (cgroups), `cpus` CPUs of time (CFS quota), and per process `cpu_seconds` of CPU
    time and files of at most `disk_mb` (rlimits). The container's first process, `cat` under
    Docker's init, reads a stdin that only this process holds (attached, with StdinOnce): when
    this process dies, for any reason, `cat` sees EOF, the container stops and Docker removes
    it. Each script runs as root in `/`, entering the container from the host
    (`benchmarks/memrl_bench/environments/os_machines/os_enter.py`, as in `BwrapSandbox`) in its cgroups, with its
    capabilities and rlimits: the agent's in a PID namespace inside the container's, where its
    processes cannot reach the check's; one that runs over its time is killed with its process group.

    The check (`run(script, trusted=True)`) runs in the container's own PID namespace (it sees the
    agent's processes) and in the check's world built from `pristine`, the host directory holding
    the image's files (`docker_images.image_files`), shown read-only at `PRISTINE` (`os_check_view`,
    `os_check_guard`): the image's files, the agent's state only as data. That needs root on the daemon's machine; otherwise `untrusted_check`
    says why and every script, the check too, runs with `docker exec bash -c SCRIPT`, as LLB does.
    """

    def __init__(self, client: Any, image: str, timeout: float, memory_mb: int = 1024, nproc: int = 256,
                 cpu_seconds: int = 60, disk_mb: int = 1024, cpus: float = 1.0, pristine: str | None = None) -> None:
        import docker

        self.timeout = float(timeout)
        self._api = client.api
        self._stdin: Any = None
        self._limit_hit: str | None = None  # "memory" or "disk", as scripts reported it
        mib = 1024 * 1024
        # CPU: SIGXCPU at `cpu_seconds` (exit status 152), SIGKILL one second later if ignored.
        rlimits = {"cpu": (cpu_seconds, cpu_seconds + 1), "fsize": (disk_mb * mib,) * 2, "core": (0, 0)}
        self._check_rlimits = {name: soft for name, (soft, _) in rlimits.items()}  # os_enter adds CPU's second
        host_config = self._api.create_host_config(
            auto_remove=True, init=True, network_mode="none", cap_drop=["MKNOD"],
            mem_limit=memory_mb * mib, memswap_limit=memory_mb * mib, pids_limit=nproc, nano_cpus=int(cpus * 1e9),
            ulimits=[docker.types.Ulimit(name=name, soft=soft, hard=hard) for name, (soft, hard) in rlimits.items()],
            binds={pristine: {"bind": PRISTINE, "mode": "ro"}} if pristine else None,
        )
        config = self._api.create_container_config(
            image, ["cat"], stdin_open=True, hostname=SANDBOX_HOSTNAME, host_config=host_config,
            labels={"memrl.sandbox": "llb-os", "memrl.owner-pid": str(os.getpid())},
        )
        config["StdinOnce"] = True  # the SDK has no argument for it
        try:
            self.id = self._api.create_container_from_config(config)["Id"]
        except Exception as exc:
            raise SandboxError(f"could not create a container from {image}: {exc}") from exc
        try:
            self._stdin = self._api.attach_socket(self.id, params={"stdin": 1, "stream": 1})
            self._api.start(self.id)
            self._host_pid = int(self._api.inspect_container(self.id)["State"].get("Pid") or 0)
        except Exception as exc:
            self.close()
            raise SandboxError(f"could not start a container from {image}: {exc}") from exc
        # The container's cgroups, seen from this machine (None when the daemon runs elsewhere).
        self._cgroup = Cgroup.of_process(self._host_pid) if self._host_pid else None
        on_this_machine = self._cgroup is not None and any(
            self.id in str(directory) for directory in self._cgroup.directories.values())
        self.untrusted_check: str | None = (
            None if pristine and on_this_machine and os.geteuid() == 0
            else "the image's files are not on this machine" if not pristine
            else "the Docker daemon does not run on this machine" if not on_this_machine
            else "entering the container for the check needs root"
        )
        if not on_this_machine:
            self._cgroup = None
        self._agent_pid = 0
        if self.untrusted_check is None:
            try:
                self._agent_pid = start_agent_namespace(self._host_pid, self._cgroup)
            except SandboxError:
                self.close()
                raise

    def run(self, script: str, trusted: bool = False) -> CommandResult:
        """Run `script` with `bash -c` as root in `/` (see the class docstring).

        `trusted` (the check that grades the episode) runs it in the check's world (the image's
        files, the agent's state only as data; unless `untrusted_check`). Otherwise the script's output
        goes to a file that `_DOCKER_WRAPPER` prints once bash exits, so a background process it
        leaves holds that file, never the exec's stream (Docker would then report neither this
        exec's end nor later ones').
        """
        if self.untrusted_check is None:  # the check: beyond the reach of the agent's processes
            target = self._host_pid if trusted else self._agent_pid
            command = enter_command(target, self._check_rlimits, self._cgroup, trusted, script)
            return self._noted(run_captured(command, self.timeout))
        out = f"/dev/shm/.memrl-out-{uuid.uuid4().hex}"
        started = time.monotonic()
        exec_id, raw = self._exec(["sh", "-c", _DOCKER_WRAPPER, "sh", script, out, str(MAX_CAPTURED_BYTES)])
        try:
            output, finished = _read_frames(raw, started + self.timeout)
        finally:
            raw.close()
        if finished:
            for _ in range(100):  # Docker records the exit code just after the stream ends
                state = self._api.exec_inspect(exec_id)
                if not state["Running"] and state["ExitCode"] is not None:
                    return self._noted(CommandResult(exit_code=state["ExitCode"], output=decode(output),
                                                     timed_out=False))
                time.sleep(0.02)
        self._kill_exec(self._api.exec_inspect(exec_id).get("Pid") or 0)
        exec_id, raw = self._exec(["sh", "-c", 'head -c "$2" "$1"; rm -f "$1"', "sh", out, str(MAX_CAPTURED_BYTES)])
        try:
            partial, _ = _read_frames(raw, time.monotonic() + 10)
        finally:
            raw.close()
        return self._noted(CommandResult(exit_code=None, output=decode(partial), timed_out=True))

    def _noted(self, result: CommandResult) -> CommandResult:
        """`result`, after noting a memory or disk limit its output reports."""
        self._limit_hit = self._limit_hit or reported_limit(result)
        return result

    def limit_hit(self) -> str | None:
        """Which limit the container ran into so far: "memory", "processes", "disk" or None.

        Memory and processes: the container's cgroups (the OOM killer ran, a fork was refused),
        or a script that reported running out of memory; disk: a file reached `disk_mb` (SIGXFSZ)
        or the writable layer was full.
        """
        return (self._cgroup.limit_hit() if self._cgroup else None) or self._limit_hit

    def _exec(self, command: list[str]) -> tuple[str, Any]:
        """Start `command` in the container; its id and the raw socket of its output."""
        try:
            exec_id = self._api.exec_create(self.id, command, workdir="/", user="root")["Id"]
            stream = self._api.exec_start(exec_id, socket=True)
        except Exception as exc:
            raise SandboxError(f"docker exec failed (the container is gone?): {exc}") from exc
        return exec_id, getattr(stream, "_sock", stream)

    def _kill_exec(self, pid: int) -> None:
        """Kill a timed-out exec's process group, if `pid` is this container's process on this machine."""
        try:
            if pid and self.id in Path(f"/proc/{pid}/cgroup").read_text():
                os.killpg(pid, signal.SIGKILL)  # docker exec starts each process in a session of its own
        except (OSError, ProcessLookupError):
            pass  # gone, or the daemon runs elsewhere: the exec is abandoned, as in LLB

    def close(self) -> None:
        """Kill and remove the container; return once Docker no longer lists it."""
        import docker

        try:
            self._api.remove_container(self.id, force=True)
        except docker.errors.APIError:
            pass  # already gone, or its auto-removal is under way
        for _ in range(100):
            try:
                self._api.inspect_container(self.id)
            except docker.errors.NotFound:
                break
            time.sleep(0.1)
        if self._stdin is not None:
            getattr(self._stdin, "_sock", self._stdin).close()
            self._stdin = None


def _read_frames(raw: Any, deadline: float) -> tuple[bytearray, bool]:
    """Read a docker exec's multiplexed stdout+stderr until EOF (True) or `deadline` (False)."""
    frames, output = bytearray(), bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([raw], [], [], remaining)[0]:
            return output, False
        data = raw.recv(65536)
        if not data:
            return output, True
        frames += data
        while len(frames) >= 8 and len(frames) >= 8 + int.from_bytes(frames[4:8], "big"):
            size = int.from_bytes(frames[4:8], "big")  # header: stream, 0, 0, 0, size (big-endian)
            output += frames[8:8 + size]
            del frames[:8 + size]
