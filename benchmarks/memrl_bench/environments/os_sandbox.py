"""Throw-away Linux machines for the Lifelong Agent Bench OS tasks.

LLB runs every sample as root in a fresh Ubuntu container and runs each script with
`docker exec bash -c SCRIPT`: a new shell per script (cwd `/`, no shell state carried over),
while files, users and background processes persist until the container is killed.

Two backends give the same contract (`Sandbox.run(script) -> CommandResult`, `close()`):

* `DockerSandbox`: a container per sample, without network and with memory, process and CPU
  limits, from memrl's Debian image (`memrl_bench.environments.docker_images`: this module's rootfs loaded
  with `docker import`, built on first use), used when a Docker daemon answers.
* `BwrapSandbox`: no Docker. A Debian rootfs made once with `debootstrap --variant=minbase`
  (`ensure_rootfs`), and per sample a fresh overlay (the rootfs as read-only lower layer,
  a temporary upper layer) mounted in a private mount namespace and entered with `bwrap`
  (new pid/net/ipc/uts namespaces, own /proc and /dev, no network). One long-lived bwrap
  process per sample holds the namespaces; each script enters them with `nsenter`, so a
  background process started by one script is still there for the next one and for the
  check. Scripts run as root with Docker's default capabilities minus CAP_MKNOD (no
  CAP_SYS_ADMIN: no mounting, no escaping the overlay).
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from memrl_cli.errors import MemrlError

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# What the LLB scripts call beyond Debian's minimal base: addgroup (adduser), pgrep/ps
# (procps), file, vi with Vim script (vim; vim-tiny lacks `:call`), zsh (two initialisation
# scripts `apt-get install zsh`, which works offline once it is installed) and python3,
# which LLB's own Ubuntu image also ships.
EXTRA_PACKAGES = ("adduser", "procps", "file", "vim", "zsh", "python3")
ROOTFS_MARKER = ".memrl-rootfs.json"
DOCKER_IMAGE = "memrl/llb-os"  # memrl's own image (`memrl_bench.environments.docker_images`), built on first use
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TRUSTED_PATH = "/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin:/usr/local/bin"  # the agent's tools last
SANDBOX_HOSTNAME = "llb-os"
# Docker's default capability set, minus MKNOD (a root process with CAP_MKNOD could create
# and open the host's block devices, since there is no device cgroup here).
KEPT_CAPABILITIES = (
    "chown", "dac_override", "fowner", "fsetid", "kill", "setgid", "setuid", "setpcap",
    "net_bind_service", "net_raw", "sys_chroot", "setfcap", "audit_write",
)
# The same set as capability numbers (linux/capability.h), for `os_enter.py`.
_KEPT_CAPABILITY_NUMBERS = "0,1,3,4,5,6,7,8,10,13,18,29,31"
ENTER_SCRIPT = Path(__file__).with_name("os_enter.py")
PRISTINE = "/dev/.memrl-pristine"  # where the sandbox shows the rootfs read-only (os_enter.PRISTINE)
MAX_CAPTURED_BYTES = 1 << 20  # keep at most 1 MiB of one script's output
_OOM_MARKERS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")
# A process killed by SIGXFSZ (bash reports it), or a full writable layer.
_DISK_MARKERS = ("File size limit exceeded", "No space left on device")
_SIGXFSZ_EXIT = 128 + 25  # bash's exit status when its command died of SIGXFSZ
# How DockerSandbox runs a script ($1), its output file ($2) and the output cap ($3).
_DOCKER_WRAPPER = 'bash -c "$1" >"$2" 2>&1; status=$?; head -c "$3" "$2"; rm -f "$2"; exit $status'
_DRAIN_SECONDS = 0.2
_START_SECONDS = 30.0  # after a script exits, how long to wait for output still in flight
INSTALL_HINT = "install them with `apt-get install bubblewrap debootstrap` (run as root)"


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


class _Cgroup:
    """A pids + memory cgroup for one sandbox (cgroup v1 hierarchies or v2), or None if not writable."""

    def __init__(self, directories: dict[str, Path]) -> None:
        self.directories = directories  # controller -> directory ("unified" for v2)

    @classmethod
    def create(cls, name: str, limits: Limits) -> _Cgroup | None:
        memory = (limits.memory_mb + limits.disk_mb) * 1024 * 1024  # tmpfs pages count as memory
        base = Path("/sys/fs/cgroup")
        own = dict(line.split(":", 2)[1:] for line in Path("/proc/self/cgroup").read_text().splitlines())
        if (base / "cgroup.controllers").exists():
            plan = {"unified": (base / name, {"pids.max": limits.nproc, "memory.max": memory})}
        else:
            plan = {"pids": (base / "pids" / own.get("pids", "/").lstrip("/") / name, {"pids.max": limits.nproc}),
                    "memory": (base / "memory" / own.get("memory", "/").lstrip("/") / name,
                               {"memory.limit_in_bytes": memory})}
        made: dict[str, Path] = {}
        try:
            for controller, (directory, settings) in plan.items():
                directory.mkdir()
                made[controller] = directory
                for key, value in settings.items():
                    (directory / key).write_text(str(value))
        except OSError:
            cls(made).remove()
            return None
        return cls(made)

    @classmethod
    def of_process(cls, pid: int) -> _Cgroup | None:
        """The cgroups process `pid` is in (e.g. a Docker container's), or None if they are not visible here.

        Never `remove()` these: they belong to whoever made them.
        """
        base = Path("/sys/fs/cgroup")
        found: dict[str, Path] = {}
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            _, controllers, path = line.split(":", 2)
            hierarchy = base / controllers.replace("name=", "") if controllers else base  # "" is cgroup v2
            if (hierarchy / path.lstrip("/") / "cgroup.procs").exists():
                found[controllers or "unified"] = hierarchy / path.lstrip("/")
        return cls(found) if found else None

    def procs_files(self) -> list[str]:
        return [str(directory / "cgroup.procs") for directory in self.directories.values()]

    def limit_hit(self) -> str | None:
        """"processes" when a fork was refused, "memory" when the OOM killer ran, else None."""
        for directory in self.directories.values():
            for events, key, hit in (("pids.events", "max", "processes"), ("memory.events", "oom_kill", "memory"),
                                     ("memory.oom_control", "oom_kill", "memory")):
                try:
                    counts = dict(line.split() for line in (directory / events).read_text().splitlines())
                except (OSError, ValueError):
                    continue
                if int(counts.get(key, 0)) > 0:
                    return hit
        return None

    def remove(self) -> None:
        """Remove the cgroups (waiting briefly for the killed processes to leave them)."""
        for directory in self.directories.values():
            for _ in range(50):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


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

        `trusted` (the check): with the pristine image's tools, whatever the agent replaced.
        """
        ...

    def limit_hit(self) -> str | None:
        """Which limit the machine ran into so far: "memory", "processes", "disk" or None."""
        ...

    def close(self) -> None:
        """Kill everything in the machine and delete its state."""
        ...


# ----------------------------------------------------------------------------- rootfs


def default_rootfs_path(suite: str = SUITE) -> Path:
    """Where the shared rootfs lives: `$XDG_CACHE_HOME/memrl/rootfs-<suite>` (~/.cache by default)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "memrl" / f"rootfs-{suite}"


def rootfs_ready(path: Path, packages: tuple[str, ...] = EXTRA_PACKAGES) -> bool:
    """True when `path` holds a finished rootfs built by `ensure_rootfs` with `packages`."""
    try:
        marker = json.loads((path / ROOTFS_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("packages") == list(packages)


def ensure_rootfs(path: str | Path | None = None, suite: str = SUITE, mirror: str = MIRROR,
                  packages: tuple[str, ...] = EXTRA_PACKAGES) -> Path:
    """Return a ready Debian rootfs (minbase plus `packages`) at `path`, building it with debootstrap if needed.

    The build (a few minutes; downloads ~60 MB from the Debian mirror) happens once; a file
    lock makes concurrent callers wait for one build instead of racing.
    """
    target = Path(path).expanduser() if path else default_rootfs_path(suite)
    if rootfs_ready(target, packages):
        return target
    if os.geteuid() != 0:
        raise MemrlError(f"the LLB OS rootfs {target} does not exist and building it needs root; run once as root")
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise MemrlError(f"debootstrap is missing, needed to build the LLB OS rootfs; {INSTALL_HINT}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if rootfs_ready(target, packages):
            return target
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        command = [
            debootstrap, "--variant=minbase", "--include=" + ",".join(packages), suite, str(partial), mirror,
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
            raise MemrlError(f"debootstrap failed ({' | '.join(tail)}); check access to {mirror} and retry")
        (partial / ROOTFS_MARKER).write_text(
            json.dumps({"suite": suite, "mirror": mirror, "packages": list(packages), "built": time.time()})
        )
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    return target


# ----------------------------------------------------------------------------- bwrap backend


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
        self._cgroup = _Cgroup.create(self._dir.name, limits)
        self._out_of_memory = False  # a script reported running out of memory (the address-space limit)
        try:
            self._pid = self._start(Path(rootfs))
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
        """Run `script` in the sandbox's namespaces, cgroups and rlimits (see `benchmarks/memrl_bench/environments/os_enter.py`).

        `trusted` (for the check that grades the episode) runs it with the pristine rootfs's
        shell, tools, loader and libraries, and the system directories first on PATH.
        """
        if self._process is None or self._process.poll() is not None:
            raise SandboxError("the LLB OS sandbox is no longer running")
        command = _enter_command(self._pid, self.limits.rlimits(), self._cgroup, trusted, script)
        result = _run_captured(command, self.timeout)
        if _reported_limit(result) == "memory":
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


def _reported_limit(result: CommandResult) -> str | None:
    """The limit a script's own result reports: "memory" (an allocation failed), "disk" (SIGXFSZ, a full layer)."""
    if any(marker in result.output for marker in _OOM_MARKERS):
        return "memory"
    if result.exit_code == _SIGXFSZ_EXIT or any(marker in result.output for marker in _DISK_MARKERS):
        return "disk"
    return None


def _enter_command(pid: int, rlimits: dict[str, int], cgroup: _Cgroup | None, trusted: bool, script: str) -> list[str]:
    """The host command running `script` with `bash -c` in the namespaces of `pid` (`benchmarks/memrl_bench/environments/os_enter.py`).

    It joins `cgroup`, sets `rlimits` and keeps only `KEPT_CAPABILITIES`; `trusted` (the check)
    runs it in the trusted view: the pristine rootfs's tools, loader and libraries (at `PRISTINE`).
    """
    return [
        sys.executable, "-I", "-S", str(ENTER_SCRIPT), str(pid), _KEPT_CAPABILITY_NUMBERS,
        json.dumps(rlimits), json.dumps(cgroup.procs_files() if cgroup else []),
        "trusted" if trusted else "untrusted", "--",
        "/usr/bin/env", "-i", f"PATH={TRUSTED_PATH if trusted else SANDBOX_PATH}", "HOME=/root", "USER=root",
        "LOGNAME=root", "/usr/bin/bash", "-c", script,
    ]


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


def _run_captured(command: list[str], timeout: float) -> CommandResult:
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
                return CommandResult(exit_code=process.returncode, output=_decode(chunks), timed_out=False)
            if drain_until is None and now > deadline:
                _kill_group(process)
                return CommandResult(exit_code=None, output=_decode(chunks), timed_out=True)
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


def _decode(data: bytes | bytearray) -> str:
    return bytes(data).decode("utf-8", errors="replace")


# ----------------------------------------------------------------------------- docker backend


class DockerSandbox:
    """A fresh container per sample: no network, limits, removed at `close()` or if memrl dies.

    Limits: `memory_mb` of memory (no swap) and `nproc` processes/threads for the whole
    container (cgroups), `cpus` CPUs of time (CFS quota), and per process `cpu_seconds` of CPU
    time and files of at most `disk_mb` (rlimits). The container's first process, `cat` under
    Docker's init, reads a stdin that only this process holds (attached, with StdinOnce): when
    this process dies, for any reason, `cat` sees EOF, the container stops and Docker removes
    it. Each script runs as `docker exec bash -c SCRIPT` as root in `/`; one that runs over its
    time is killed with its process group (when the daemon shares this machine's pid space).

    The check (`run(script, trusted=True)`) does not go through `docker exec`, which would run
    the agent's shell and tools: `pristine`, the host directory holding the image's files
    (`docker_images.image_files`), is shown read-only at `PRISTINE`, and the check enters the
    container from the host (`benchmarks/memrl_bench/environments/os_enter.py`, as in `BwrapSandbox`), in its cgroups,
    with its capabilities, in the trusted view built from `PRISTINE`. That needs root on the
    daemon's machine; otherwise `untrusted_check` says why and the check runs with `docker exec`.
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
        self._cgroup = _Cgroup.of_process(self._host_pid) if self._host_pid else None
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

    def run(self, script: str, trusted: bool = False) -> CommandResult:
        """Run `script` with `bash -c` as root in `/` (see the class docstring).

        `trusted` (the check that grades the episode) runs it with the image's pristine shell,
        tools, loader and libraries (unless `untrusted_check`). Otherwise the script's output
        goes to a file that `_DOCKER_WRAPPER` prints once bash exits, so a background process it
        leaves holds that file, never the exec's stream (Docker would then report neither this
        exec's end nor later ones').
        """
        if trusted and self.untrusted_check is None:
            command = _enter_command(self._host_pid, self._check_rlimits, self._cgroup, True, script)
            return self._noted(_run_captured(command, self.timeout))
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
                    return self._noted(CommandResult(exit_code=state["ExitCode"], output=_decode(output),
                                                     timed_out=False))
                time.sleep(0.02)
        self._kill_exec(self._api.exec_inspect(exec_id).get("Pid") or 0)
        exec_id, raw = self._exec(["sh", "-c", 'head -c "$2" "$1"; rm -f "$1"', "sh", out, str(MAX_CAPTURED_BYTES)])
        try:
            partial, _ = _read_frames(raw, time.monotonic() + 10)
        finally:
            raw.close()
        return self._noted(CommandResult(exit_code=None, output=_decode(partial), timed_out=True))

    def _noted(self, result: CommandResult) -> CommandResult:
        """`result`, after noting a memory or disk limit its output reports."""
        self._limit_hit = self._limit_hit or _reported_limit(result)
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


# ----------------------------------------------------------------------------- choice


class SandboxFactory:
    """Makes one sandbox per sample with the backend chosen once.

    `backend`: "auto" (Docker if a daemon answers, else bwrap), "docker" or "bwrap".
    `rootfs`: the bwrap rootfs directory (built on first use; default `default_rootfs_path()`).
    `image`: the Docker image; the default `DOCKER_IMAGE` is memrl's (`memrl_bench.environments.docker_images`,
    built on first use), any other must exist and have `bash` and `cat`.
    Picklable: the Docker client and the rootfs check are made lazily in each process.
    """

    def __init__(self, backend: str = "auto", timeout: float = 20.0, rootfs: str | Path | None = None,
                 image: str = DOCKER_IMAGE, limits: Limits = Limits()) -> None:
        if backend not in ("auto", "docker", "bwrap"):
            raise MemrlError(f"unknown LLB OS sandbox backend {backend!r}; choose auto, docker or bwrap")
        self.backend = backend
        self.timeout = float(timeout)
        self.rootfs = rootfs
        self.image = image
        self.limits = limits
        self._client: Any = None
        self._image_tag = image
        self._pristine: str | None = None
        self._rootfs_path: Path | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None, "_pristine": None, "_rootfs_path": None}

    def resolve(self) -> str:
        """Pick the backend now ("docker" or "bwrap") and prepare it (image or rootfs)."""
        if self._client is not None:
            return "docker"
        if self._rootfs_path is not None:
            return "bwrap"
        if self.backend in ("auto", "docker"):
            from memrl_bench.environments import docker_images  # it builds on this module's rootfs

            self._client = docker_images.require_docker() if self.backend == "docker" else docker_images.docker_client()
            if self._client is not None:
                own = self.image == DOCKER_IMAGE
                self._image_tag = docker_images.ensure_image(self._client, "llb-os") if own else self.image
                self._pristine = docker_images.image_files(self._client, self._image_tag)
                return "docker"
        check_bwrap_tools()
        self._rootfs_path = ensure_rootfs(self.rootfs)
        return "bwrap"

    def create(self) -> Sandbox:
        """A fresh sandbox for one sample."""
        if self.resolve() == "docker":
            return DockerSandbox(self._client, self._image_tag, self.timeout, **asdict(self.limits),
                                 pristine=self._pristine)
        assert self._rootfs_path is not None
        return BwrapSandbox(self._rootfs_path, self.timeout, self.limits)
