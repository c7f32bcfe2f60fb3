"""One LLB OS machine, whichever backend runs it: what it promises and what its results say.

Every backend (`os_bwrap.BwrapSandbox`, `os_docker.DockerSandbox`) is a `Sandbox`: `run(script)`
returns a `CommandResult`, `limit_hit()` names the limit the machine ran into, `close()` ends it.
Each script runs as root in `/`, in a new shell, on the hostname `SANDBOX_HOSTNAME`, with
`SANDBOX_PATH` (the check: `os_exec.TRUSTED_PATH`); the pristine image is shown read-only at
`PRISTINE` for the check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from memrl_cli.errors import MemrlError

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SANDBOX_HOSTNAME = "llb-os"
PRISTINE = "/dev/.memrl-pristine"  # where the sandbox shows the rootfs read-only (os_check_view.PRISTINE)
MAX_CAPTURED_BYTES = 1 << 20  # keep at most 1 MiB of one script's output
_OOM_MARKERS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")
# A process killed by SIGXFSZ (bash reports it), or a full writable layer.
_DISK_MARKERS = ("File size limit exceeded", "No space left on device")
_SIGXFSZ_EXIT = 128 + 25  # bash's exit status when its command died of SIGXFSZ


class SandboxError(MemrlError):
    """The sandbox itself failed (could not start, died, Docker error): the environment's fault."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandbox: all its processes together may hold `memory_mb` of
    memory and `nproc` processes/threads (a cgroup), write `disk_mb` (the size of the tmpfs
    holding its overlay's upper layer); each process gets `cpu_seconds` of CPU time and an
    address space of `memory_mb` (rlimits). `DockerSandbox` maps them to Docker's limits."""

    memory_mb: int = 1024
    nproc: int = 256
    cpu_seconds: int = 60
    disk_mb: int = 1024

    def rlimits(self) -> dict[str, int]:
        mib = 1024 * 1024
        return {"as": self.memory_mb * mib, "cpu": self.cpu_seconds, "fsize": self.disk_mb * mib, "core": 0}


@dataclass(frozen=True)
class CommandResult:
    """What one script did: exit code (None on timeout), combined stdout+stderr, timeout flag."""

    exit_code: int | None
    output: str
    timed_out: bool


class Sandbox(Protocol):
    """One sample's machine."""

    def run(self, script: str, trusted: bool = False) -> CommandResult:
        """Run `script` with `bash -c` as root in `/`, within the sandbox's time limit.

        `trusted` (the check): in the pristine image, the agent's state only as data.
        """
        ...

    def limit_hit(self) -> str | None:
        """Which limit the machine ran into so far: "memory", "processes", "disk" or None."""
        ...

    def close(self) -> None:
        """Kill everything in the machine and delete its state."""
        ...


def reported_limit(result: CommandResult) -> str | None:
    """The limit a script's own result reports: "memory" (an allocation failed), "disk" (SIGXFSZ, a full layer)."""
    if any(marker in result.output for marker in _OOM_MARKERS):
        return "memory"
    if result.exit_code == _SIGXFSZ_EXIT or any(marker in result.output for marker in _DISK_MARKERS):
        return "disk"
    return None
