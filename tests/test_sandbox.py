"""The process sandbox really contains hostile programs (network, writes, fork bombs, memory)."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from memrl_bench.adapters.bigcodebench.benchmark import python_readable_paths
from memrl_bench.environments.sandbox import SandboxResult, live_pids_of_uid, run_sandboxed
from memrl_cli.errors import MemrlError

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not shutil.which("bwrap"),
    reason="needs Linux with bubblewrap (apt-get install bubblewrap)",
)

PYTHON = sys.executable
READABLE = python_readable_paths(PYTHON)


def run_python(code: str, workdir: Path, timeout: float = 20, **kwargs) -> SandboxResult:
    kwargs.setdefault("readable", READABLE)
    return run_sandboxed([PYTHON, "-c", code], workdir, timeout=timeout, **kwargs)


class ListeningServer:
    """A TCP server on 127.0.0.1 (in the test's network) that records accepted connections."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.socket.settimeout(0.2)
        self.port = self.socket.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self.socket.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            connection.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.socket.close()


def test_runs_command_in_workdir_and_captures_output(tmp_path: Path) -> None:
    result = run_python("import os; open('made.txt', 'w').write('ok'); print('out'); "
                        "import sys; print('err', file=sys.stderr); print(os.getcwd()); sys.exit(3)", tmp_path)
    assert result.returncode == 3 and not result.timed_out
    assert result.stdout.splitlines() == ["out", str(tmp_path)]
    assert result.stderr.strip() == "err"
    assert (tmp_path / "made.txt").read_text() == "ok"


def test_no_network_connection_reaches_host_server(tmp_path: Path) -> None:
    server = ListeningServer()
    try:
        code = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {server.port}), timeout=3)\n"
                "    print('CONNECTED')\nexcept OSError as e:\n    print('BLOCKED', e)")
        blocked = run_python(code, tmp_path)
        time.sleep(0.3)
        assert "BLOCKED" in blocked.stdout and server.accepted == 0
        allowed = run_python(code, tmp_path, network=True)  # the same probe does connect when allowed
        time.sleep(0.3)
        assert "CONNECTED" in allowed.stdout and server.accepted == 1
    finally:
        server.close()


def test_cannot_write_outside_workdir(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    outside = tmp_path / "outside.txt"
    in_repo = Path("/work") / f"sandbox-escape-{uuid.uuid4().hex}.txt"
    code = "\n".join(
        f"try:\n    open({str(path)!r}, 'w').write('x')\n    print('WROTE', {str(path)!r})\n"
        f"except OSError as e:\n    print('DENIED', e)"
        for path in (outside, in_repo, Path("/etc/memrl-escape"), Path.home() / "memrl-escape")
    )
    result = run_python(code, workdir)
    assert "WROTE" not in result.stdout and result.stdout.count("DENIED") == 4
    assert not outside.exists() and not in_repo.exists() and not Path("/etc/memrl-escape").exists()


def test_host_tmp_and_private_files_are_hidden(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    workdir = tmp_path / "work"
    workdir.mkdir()
    result = run_python(f"import os\nprint(os.path.exists({str(secret)!r}))\nprint(os.getuid())", workdir)
    exists, uid = result.stdout.split()
    assert exists == "False"
    if os.geteuid() == 0:
        assert int(uid) != 0  # root outside, a stranger inside


def test_fork_bomb_is_contained(tmp_path: Path) -> None:
    code = "import os\nopen('uid', 'w').write(str(os.getuid()))\nwhile True:\n    os.fork()"
    start = time.monotonic()
    result = run_python(code, tmp_path, timeout=8, nproc=32)
    assert time.monotonic() - start < 20
    assert result.timed_out or result.returncode != 0
    uid = int((tmp_path / "uid").read_text())
    assert live_pids_of_uid(uid) == []  # nothing left behind
    assert run_python("print('alive')", tmp_path).stdout.strip() == "alive"


def test_memory_hog_is_stopped_and_reported(tmp_path: Path) -> None:
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 1024 * 1024))"
    result = run_python(code, tmp_path, memory_mb=512)
    assert result.returncode not in (0, None) and not result.timed_out
    assert result.out_of_memory


def test_timeout_kills_everything(tmp_path: Path) -> None:
    code = ("import os, subprocess\nopen('uid', 'w').write(str(os.getuid()))\n"
            "subprocess.Popen(['sleep', '300'], start_new_session=True)\nwhile True:\n    pass")
    start = time.monotonic()
    result = run_python(code, tmp_path, timeout=2)
    assert result.timed_out and result.returncode is None
    assert time.monotonic() - start < 6
    assert live_pids_of_uid(int((tmp_path / "uid").read_text())) == []


def test_output_is_bounded(tmp_path: Path) -> None:
    result = run_python("import sys\nsys.stdout.write('x' * 5_000_000)", tmp_path, output_limit=10_000)
    assert result.returncode == 0 and result.output_truncated and len(result.stdout) == 10_000


def test_missing_bwrap_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("prlimit", "setpriv"):  # everything else the sandbox needs is still there
        (tools / tool).symlink_to(shutil.which(tool))
    monkeypatch.setenv("PATH", str(tools))
    with pytest.raises(MemrlError, match="apt-get install bubblewrap"):
        run_python("print(1)", tmp_path)


def test_unsandboxed_mode_runs_with_limits(tmp_path: Path) -> None:
    result = run_python("import resource; print(resource.getrlimit(resource.RLIMIT_AS)[0])", tmp_path,
                        memory_mb=1024, isolation="none")
    assert result.returncode == 0 and int(result.stdout) == 1024 * 1024 * 1024


def test_readable_paths_are_exposed_read_only_and_alone(tmp_path: Path) -> None:
    private = tmp_path / "private"
    shared = private / "lib" / "shared"
    shared.mkdir(parents=True)
    (shared / "data.txt").write_text("exposed")
    (private / "secret.txt").write_text("hidden")
    private.chmod(0o700)
    workdir = tmp_path / "work"
    workdir.mkdir()
    code = (f"import os\nprint(open({str(shared / 'data.txt')!r}).read())\n"
            f"print(os.path.exists({str(private / 'secret.txt')!r}))\n"
            f"try:\n    open({str(shared / 'new.txt')!r}, 'w')\nexcept OSError:\n    print('read-only')")
    result = run_python(code, workdir, readable=[*READABLE, shared])
    assert result.stdout.split() == ["exposed", "False", "read-only"]
    assert not (shared / "new.txt").exists()
