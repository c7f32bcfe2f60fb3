"""`kill` (SIGTERM) of `memrl bench` or of the local-model launcher leaves no process behind.

Each command runs as a real subprocess in its own session; after SIGTERM to its main process, no
process of that session may remain (an orphan adopted by PID 1 keeps its session id).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import conftest
import pytest
from benchmarks.testing.chat_server import ScriptedChatServer
from benchmarks.testing.toy_benchmark import responder

from memrl_bench.environments.local_llm import free_port, gguf_path, require_llama_server
from memrl_cli.bank import MemoryBank
from memrl_cli.errors import MemrlError

REPO = Path(__file__).resolve().parents[1]


def session_processes(sid: int) -> list[str]:
    """Command lines of the live (non-zombie) processes in session `sid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(f"{entry.name}: {cmdline}")
    return found


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def terminate_and_check(proc: subprocess.Popen) -> str:
    """SIGTERM the main process only; require it to exit and its whole session to be gone. Return stderr."""
    proc.send_signal(signal.SIGTERM)
    try:
        _, stderr = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    deadline = time.monotonic() + 10
    while session_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = session_processes(proc.pid)
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
    assert not left, f"processes left behind after SIGTERM: {left}"
    return stderr


def bench(runs: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "memrl_cli", "bench", "benchmarks.testing.toy_benchmark:Passcodes", "--epochs", "50",
                             "--batch-size", "2", "--option", "rooms=6", "--option", "delay=0.3",
                             "--runs-dir", str(runs), *extra], cwd=REPO, env=conftest.cli_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.mark.parametrize("in_flight", [[], ["--batch-size", "6", "--concurrency", "6"]], ids=["one-per-process", "threads"])
def test_sigterm_to_bench_stops_its_workers_and_marks_the_run_interrupted(tmp_path: Path, in_flight: list[str]) -> None:
    with ScriptedChatServer(responder) as server:
        proc = bench(tmp_path, "--workers", "2", "--base-url", server.base_url, "--model", "scripted", *in_flight)
        wait_for(lambda: len([p for p in session_processes(proc.pid) if "multiprocessing" in p]) >= 2
                 and list(tmp_path.glob("*/bank.db")), 120, "the two episode workers and the run's bank")
        time.sleep(1.0)  # episodes in flight
        stderr = terminate_and_check(proc)
    assert proc.returncode == 130 and stderr.rstrip().endswith("memrl: interrupted"), stderr
    with MemoryBank(next(tmp_path.glob("*/bank.db")), create=False) as bank:
        assert bank.conn.execute("SELECT status FROM runs").fetchone()[0] == "interrupted"


def _offline_model_or_skip() -> None:
    try:
        require_llama_server()
        gguf_path()
    except MemrlError as exc:
        pytest.skip(str(exc))


@pytest.mark.slow
def test_sigterm_to_bench_stops_the_local_model_server(tmp_path: Path) -> None:
    _offline_model_or_skip()
    proc = bench(tmp_path, "--workers", "1", "--local-llm")
    wait_for(lambda: any("llama_cpp.server" in p for p in session_processes(proc.pid))
             and any("multiprocessing" in p for p in session_processes(proc.pid)), 180,
             "the local model server and the episode worker")
    stderr = terminate_and_check(proc)
    assert proc.returncode == 130, stderr


def test_sigterm_to_the_local_model_launcher_stops_its_server() -> None:
    _offline_model_or_skip()
    proc = subprocess.Popen([sys.executable, "-m", "memrl_bench.environments.local_llm", "--port", str(free_port())], cwd=REPO,
                            env=conftest.cli_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("ready in "), proc.stderr.read() if proc.poll() is not None else ""
    assert any("llama_cpp.server" in p for p in session_processes(proc.pid))
    terminate_and_check(proc)
    assert proc.returncode == 0
