"""Run an untrusted command in a throwaway Linux sandbox built from bubblewrap and rlimits.

`run_sandboxed(argv, workdir, ...)` runs `argv` with:

* **filesystem**: the host root read-only, a private empty `/tmp` and `/dev/shm`, and `workdir`
  (same path) as the only writable host directory; directories other users cannot enter
  (e.g. `/root`) stay closed, except the `readable` paths the caller exposes read-only;
* **no network** (a fresh network namespace with only loopback) unless `network=True`;
* **a fresh PID namespace**, so killing the sandbox kills everything it started;
* **limits**: wall time (`timeout`), address space per process (`memory_mb`), CPU seconds per
  process, file size, no core dumps, and at most `nproc` processes/threads (fork bombs fail);
* **an unprivileged identity**: when memrl runs as root, the command runs as a fresh, unused uid
  with no capabilities and `no_new_privs` (root ignores `RLIMIT_NPROC`, and a stranger uid cannot
  read private files); otherwise it runs as the caller inside a user namespace.

`isolation="none"` runs the command with the same limits and working directory but WITHOUT
namespaces: it can use the network and write anywhere the caller can. Only for trusted code.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from memrl_cli.errors import MemrlError

ISOLATIONS = ("bwrap", "none")
DEFAULT_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TZ": "UTC",
    "USER": "sandbox",
    "LOGNAME": "sandbox",
}
_OOM_MARKERS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")
_FIRST_SANDBOX_UID = 1_000_000
_SANDBOX_UID_RANGE = 1_000_000_000


@dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed command did.

    `returncode` is None when the command was killed on timeout; a negative value is the number
    of the signal that ended it (as in `subprocess`). Output beyond the capture limit is dropped
    and flagged by `output_truncated`.
    """

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    duration: float
    output_truncated: bool = False

    @property
    def signal_name(self) -> str | None:
        """Name of the signal that killed the command (e.g. "SIGKILL", "SIGXCPU"), if any."""
        if self.returncode is None or self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    @property
    def out_of_memory(self) -> bool:
        """True when the command reported running out of memory (the address-space limit)."""
        return any(marker in self.stderr for marker in _OOM_MARKERS)


def bwrap_path() -> str:
    """The `bwrap` executable, or a MemrlError saying how to install it."""
    path = shutil.which("bwrap")
    if path is None:
        raise MemrlError(
            "bubblewrap (bwrap) is required to run untrusted code: install it "
            "(apt-get install bubblewrap), or pass --option sandbox=none to run code UNSANDBOXED "
            "on a machine you trust"
        )
    return path


def run_sandboxed(
    argv: Sequence[str],
    workdir: str | os.PathLike[str],
    timeout: float,
    memory_mb: int = 4096,
    nproc: int = 64,
    network: bool = False,
    env: Mapping[str, str] | None = None,
    readable: Sequence[str | os.PathLike[str]] = (),
    file_size_mb: int = 512,
    output_limit: int = 1_000_000,
    isolation: str = "bwrap",
    input: bytes | None = None,
) -> SandboxResult:
    """Run `argv` in `workdir` (an existing directory, handed over to the sandbox) and wait.

    `env` replaces the environment (default `DEFAULT_ENV`, with HOME=workdir); `readable` lists host
    paths (e.g. a Python installation under `/root`) to expose read-only even when a parent
    directory is private. `workdir` and its content are given to the sandbox user; delete it
    afterwards.
    """
    if isolation not in ISOLATIONS:
        raise MemrlError(f"unknown sandbox isolation {isolation!r}: use one of {', '.join(ISOLATIONS)}")
    workdir = Path(workdir).resolve()
    if not workdir.is_dir():
        raise MemrlError(f"sandbox working directory {workdir} does not exist: create it first")
    full_env = dict(DEFAULT_ENV, HOME=str(workdir)) if env is None else dict(env)
    bwrap = bwrap_path() if isolation == "bwrap" else ""
    limits = _limit_argv(timeout, memory_mb, nproc, file_size_mb)
    if isolation == "none":
        command = [*limits, *argv]
    elif os.geteuid() == 0:
        uid = _FIRST_SANDBOX_UID + secrets.randbelow(_SANDBOX_UID_RANGE)
        _hand_over(workdir, uid)
        drop = [_tool("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
                "--inh-caps=-all", "--bounding-set=-all"]
        namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
        if not network:
            namespaces.append("--unshare-net")
        command = [*_bwrap_argv(bwrap, namespaces, workdir, readable, stranger=True), *limits, *drop, *argv]
        try:
            return _run(command, workdir, full_env, timeout, output_limit, input)
        finally:
            _kill_uid(uid)
    else:
        namespaces = ["--unshare-all", *(["--share-net"] if network else [])]
        command = [*_bwrap_argv(bwrap, namespaces, workdir, readable, stranger=False), *limits, *argv]
    return _run(command, workdir, full_env, timeout, output_limit, input)


def _tool(name: str) -> str:
    """Absolute path of a util-linux tool the sandbox needs."""
    path = shutil.which(name)
    if path is None:
        raise MemrlError(f"{name} is required to run untrusted code: install util-linux (apt-get install util-linux)")
    return path


def _limit_argv(timeout: float, memory_mb: int, nproc: int, file_size_mb: int) -> list[str]:
    """`prlimit` prefix setting the per-process resource limits."""
    cpu_seconds = math.ceil(timeout) + 1
    return [
        _tool("prlimit"),
        f"--as={memory_mb * 1024 * 1024}",
        f"--nproc={nproc}",
        f"--cpu={cpu_seconds}",
        f"--fsize={file_size_mb * 1024 * 1024}",
        "--core=0",
        "--",
    ]


def _bwrap_argv(bwrap: str, namespaces: list[str], workdir: Path, readable: Sequence[str | os.PathLike[str]],
                stranger: bool) -> list[str]:
    """The `bwrap` prefix: read-only host, private /tmp, writable `workdir`, exposed paths."""
    argv = [bwrap, *namespaces, "--die-with-parent", "--new-session", "--ro-bind", "/", "/"]
    argv += ["--perms", "1777", "--tmpfs", "/tmp", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/dev/shm",
             "--proc", "/proc"]
    made = {Path("/tmp"), Path("/dev/shm")}  # fresh, so host paths under them must be bound again
    bound: set[Path] = set()
    for path in sorted({Path(p).resolve() for p in readable}):
        argv += _expose_argv(path, stranger, made, bound)
    argv += ["--bind", str(workdir), str(workdir), "--chdir", str(workdir), "--"]
    return argv


def _expose_argv(path: Path, stranger: bool, made: set[Path], bound: set[Path]) -> list[str]:
    """Arguments making `path` readable: an empty tmpfs over its first closed ancestor (unless that
    is a fresh tmpfs already), open directories down to `path`, then `path` bound read-only.
    Nothing if it is already reachable."""
    ancestors = list(reversed(path.parents))[1:]  # from the top, without "/"
    closed = next((a for a in ancestors if a in made or not _enterable(a, stranger)), None)
    if closed is None or path in bound or any(a in bound for a in ancestors):
        return []
    argv: list[str] = []
    for directory in ancestors[ancestors.index(closed):]:
        if directory not in made:
            argv += ["--perms", "0755", "--tmpfs" if directory == closed else "--dir", str(directory)]
            made.add(directory)
    bound.add(path)
    return [*argv, "--ro-bind", str(path), str(path)]


def _enterable(directory: Path, stranger: bool) -> bool:
    """Whether the sandbox user can traverse `directory` (a stranger needs the others-x bit)."""
    if stranger:
        return bool(directory.stat().st_mode & 0o001)
    return os.access(directory, os.X_OK)


def _hand_over(workdir: Path, uid: int) -> None:
    """Give `workdir` and its content to `uid`; let bwrap (root without capabilities) enter it."""
    for root, dirs, files in os.walk(workdir):
        for name in (*dirs, *files):
            os.lchown(os.path.join(root, name), uid, uid)
    os.chown(workdir, uid, uid)
    os.chmod(workdir, 0o711)


def _run(command: list[str], workdir: Path, env: dict[str, str], timeout: float,
         output_limit: int, input: bytes | None = None) -> SandboxResult:
    """Start `command` in its own session, capture bounded output, kill it all on timeout."""
    start = time.monotonic()
    stdin = subprocess.DEVNULL if input is None else subprocess.PIPE
    process = subprocess.Popen(command, cwd=workdir, env=env, stdin=stdin, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True)
    assert process.stdout is not None and process.stderr is not None
    if process.stdin is not None:
        with contextlib.suppress(BrokenPipeError):
            process.stdin.write(input or b"")
        with contextlib.suppress(BrokenPipeError):
            process.stdin.close()
    readers = [_BoundedReader(process.stdout, output_limit), _BoundedReader(process.stderr, output_limit)]
    timed_out = False
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(process)
        process.wait()
    duration = time.monotonic() - start
    _kill_group(process)  # leftovers of an unsandboxed run that kept the process group
    for reader in readers:
        reader.join()
    stdout, stderr = (reader.text() for reader in readers)
    return SandboxResult(
        returncode=None if timed_out else process.returncode,
        stdout=stdout,
        stderr=stderr,
        timed_out=timed_out,
        duration=duration,
        output_truncated=any(reader.truncated for reader in readers),
    )


def _kill_uid(uid: int, grace: float = 5.0) -> None:
    """SIGKILL every live process of the sandbox's own `uid` until none is left (or `grace` ends).

    The PID namespace dies with bwrap, but asynchronously: this makes `run_sandboxed` return only
    once nothing of the sandbox runs any more.
    """
    deadline = time.monotonic() + grace
    while pids := live_pids_of_uid(uid):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)


def live_pids_of_uid(uid: int) -> list[int]:
    """PIDs of processes (not zombies) whose real uid is `uid`."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", encoding="utf-8") as handle:
                fields = dict(line.split(":", 1) for line in handle if ":" in line)
        except OSError:
            continue
        if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith(("Z", "X")):
            pids.append(int(entry.name))
    return pids


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _BoundedReader:
    """Drains a pipe in a thread, keeping the first `limit` bytes."""

    def __init__(self, stream: IO[bytes], limit: int) -> None:
        self._stream = stream
        self._limit = limit
        self._chunks: list[bytes] = []
        self._kept = 0
        self.truncated = False
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        with self._stream:
            while chunk := self._stream.read1(65536):
                room = self._limit - self._kept
                if len(chunk) > room:
                    self.truncated = True
                    chunk = chunk[:max(room, 0)]
                if chunk:
                    self._chunks.append(chunk)
                    self._kept += len(chunk)

    def join(self) -> None:
        self._thread.join(timeout=5)

    def text(self) -> str:
        return b"".join(self._chunks).decode("utf-8", errors="replace")
