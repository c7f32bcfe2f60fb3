"""`kill` (SIGTERM) of `memrl bench` or of the local-model launcher leaves no process behind.

Each command runs as a real subprocess in its own session; after SIGTERM to its main process, no
process of that session may remain (an orphan adopted by PID 1 keeps its session id).
"""

from __future__ import annotations

import json
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

from memrl_bench.framework.local_llm import free_port, gguf_path, require_llama_server
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
    proc = subprocess.Popen([sys.executable, "-m", "memrl_bench.framework.local_llm", "--port", str(free_port())], cwd=REPO,
                            env=conftest.cli_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("ready in "), proc.stderr.read() if proc.poll() is not None else ""
    assert any("llama_cpp.server" in p for p in session_processes(proc.pid))
    terminate_and_check(proc)
    assert proc.returncode == 0


def committed_batches(runs: Path) -> int:
    """Mini-batches committed so far by the one run under `runs` (0 before its bank exists)."""
    found = list(runs.glob("*/bank.db"))
    if not found:
        return 0
    try:
        with MemoryBank(found[0], create=False) as bank:
            return bank.conn.execute("SELECT count(*) FROM run_batches").fetchone()[0]
    except Exception:  # noqa: BLE001 - not yet a bank
        return 0


@pytest.mark.slow
def test_ctrl_c_names_the_run_directory_and_the_command_that_resumes_it(tmp_path: Path) -> None:
    """Ctrl-C at a terminal (SIGINT to the whole process group) stops the run and prints the resume command,
    which then finishes the run."""
    toy = "benchmarks.testing.toy_benchmark:Passcodes"
    with ScriptedChatServer(responder) as server:
        args = ["bench", toy, "--epochs", "4", "--batch-size", "2", "--option", "rooms=4", "--option", "delay=0.2",
                "--runs-dir", str(tmp_path), "--workers", "1", "--base-url", server.base_url, "--model", "scripted"]
        proc = subprocess.Popen([sys.executable, "-m", "memrl_cli", *args], cwd=REPO, env=conftest.cli_env(),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        wait_for(lambda: committed_batches(tmp_path) >= 2, 120, "two committed mini-batches")
        os.killpg(proc.pid, signal.SIGINT)
        try:
            _, stderr = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        assert proc.returncode == 130, stderr
        run_dir = next(tmp_path.glob("*/config.json")).parent
        committed = committed_batches(tmp_path)
        assert 2 <= committed < 8, committed  # really stopped mid-run
        command = (f"memrl bench {toy} --resume {run_dir} --model scripted --base-url {server.base_url}")
        assert stderr.splitlines()[-2:] == [
            f"memrl: run directory {run_dir} keeps its {committed} committed batch(es); continue with: {command}",
            "memrl: interrupted"], stderr
        resumed = subprocess.run([sys.executable, "-m", "memrl_cli", *command.split()[1:], "--json"], cwd=REPO,
                                 env=conftest.cli_env(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout)
    assert summary["run_dir"] == str(run_dir) and summary["episodes"] == 4 * 4


@pytest.mark.slow
def test_a_dying_local_model_is_one_line_with_its_signal_log_and_fix(tmp_path: Path) -> None:
    """The offline model's server dies mid-run by SIGILL (what a llama.cpp built for another CPU does on its first
    request): one error line names the signal, ends of its log, the portable reinstall and the resume command."""
    _offline_model_or_skip()
    proc = bench(tmp_path, "--workers", "1", "--local-llm")

    def server_pid() -> int | None:
        return next((int(p.split(":")[0]) for p in session_processes(proc.pid) if "llama_cpp.server" in p), None)

    wait_for(lambda: committed_batches(tmp_path) >= 1, 300, "a committed mini-batch against the local model")
    pid = server_pid()
    assert pid is not None
    os.kill(pid, signal.SIGILL)
    try:
        _, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 1, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("memrl: error:")]
    assert len(errors) == 1 and errors[0] == stderr.splitlines()[-1], stderr
    line = errors[0]
    run_dir = next(tmp_path.glob("*/config.json")).parent
    assert line.startswith("memrl: error: the local model server (llama-cpp-python) died with SIGILL "
                           "(illegal instruction); its log ends: "), line
    assert 'reinstall it portably: CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install --force-reinstall' in line
    assert line.endswith(f"continue with: memrl bench benchmarks.testing.toy_benchmark:Passcodes --resume {run_dir} "
                         "--local-llm")
    assert "--timeout" not in line and "connection" not in line.lower()
    assert "POST /v1/chat/completions" in line  # the server's own log
