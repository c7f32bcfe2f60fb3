"""Check one BigCodeBench program inside the sandbox and print an authenticated JSON verdict.

Usage: `python -I -B bcb_check.py SOLUTION.py TESTS.py`, with a secret key as the first line of
stdin, and `bcb_processes.py` beside this file. Three processes, so that the program under test
never holds the verdict, its channel, nor anything the tests compare its results with:

* the **checker** (this process, `main`, isolated by `-I`: the working directory, which the
  program can write, is not on its path) never runs the program's code nor the tests, and imports
  nothing the report names. It reads the key, makes itself non-dumpable (no other process of its
  uid can read its memory or open its descriptors through /proc, nor ptrace it), counts the test
  methods of `TESTS.py` with `ast`, makes a fresh nonce, then starts the tests' process, which
  inherits neither stdin, stdout nor the key: its output (and the program's) goes to
  `program_output.txt`; a report pipe and a pipe holding the nonce are passed. Once it has
  exited, the checker decides and prints the verdict as the last stdout line,
  `MARKER <hmac-sha256 hex> <json>`, where the json is `{"status": PASS|FAIL|RUNTIME_ERROR|
  MISSING_LIBRARY, "detail": str, "tests": int, "module": str|null}`. A line the key did not sign
  is a forgery (`memrl_bench.adapters.bigcodebench.benchmark` scores it FAIL); a report the nonce did not
  sign is one too.
* the **tests' process** and the **program's process**: `bcb_processes.py` (its docstring). The tests
  run in a process no code of the program's ever runs in; the program's functions are called over
  a socket and what they return crosses as data, rebuilt by a restricted unpickler.

The checker passes a program only if the nonce signed the tests' report and it reports every
expected test passed: 0 tests is never PASS, an early exit leaves tests unreported.

This file runs standalone (stdlib only) with the candidate's interpreter; the sandbox copies it
into the working directory.
"""

from __future__ import annotations

import ast
import hashlib
import hmac
import json
import os
import sys

MARKER = "@@BCB-VERDICT@@ "
DETAIL_CHARS = 2000
REPORT_BYTES = 1 << 20
OUTPUT_FILE = "program_output.txt"
PROCESSES_FILE = "bcb_processes.py"  # the tests' process and the program's, beside this file
_PR_SET_DUMPABLE = 4


# --------------------------------------------------------------------------- shared helpers


def sign(key: bytes, payload: str) -> str:
    """The hex HMAC-SHA256 of `payload` under `key`."""
    return hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()


def _test_class(test_source: str) -> ast.ClassDef | None:
    for node in ast.parse(test_source).body:
        if isinstance(node, ast.ClassDef) and node.name == "TestCases":
            return node
    return None


def expected_tests(test_source: str) -> list[str]:
    """Names of the `test*` methods of class `TestCases` in `test_source`, in file order."""
    node = _test_class(test_source)
    return [item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            and item.name.startswith("test")] if node else []


def _installed(module: str) -> bool:
    """Whether top-level `module` is installed, found without importing anything."""
    if not module.isidentifier():
        return False
    if module in sys.builtin_module_names:
        return True
    import importlib.machinery

    try:
        return importlib.machinery.PathFinder.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _tail(text: str) -> str:
    return text if len(text) <= DETAIL_CHARS else "..." + text[-DETAIL_CHARS:]


# --------------------------------------------------------------------------- the checker (parent)


def authentic_report(raw: bytes, nonce: str) -> tuple[dict | None, bool]:
    """The tests' process's report (None: nothing, or nothing readable) and whether the nonce signed it."""
    mac, _, body = raw.partition(b" ")
    if not raw:
        return None, True
    expected = hmac.new(nonce.encode(), body, hashlib.sha256).hexdigest().encode()
    if not hmac.compare_digest(mac, expected):
        return {}, False
    try:
        report = json.loads(body)
    except ValueError:
        return None, True
    return (report if isinstance(report, dict) else None), True


def decide(report: dict | None, names: list[str], exit_text: str, authentic: bool = True) -> dict:
    """The verdict from the tests' process's report (`authentic`: signed with the nonce) and the expected test names."""
    def verdict(status: str, detail: str, tests: int = 0, module: str | None = None) -> dict:
        return {"status": status, "detail": _tail(detail), "tests": tests, "module": module}

    if report is None:
        return verdict("RUNTIME_ERROR", f"the program ended before its tests reported ({exit_text})")
    if not authentic:
        return verdict("FAIL", "a report the tests' process did not sign with its nonce: the program forged its report")
    module = report.get("module")
    if module and _installed(str(module)):  # the tests' process's claim is checked here, not trusted (nothing imported)
        module = None
    if report.get("error"):
        status = "MISSING_LIBRARY" if module else "RUNTIME_ERROR"
        return verdict(status, str(report["error"]), 0, module)
    if not names:
        return verdict("RUNTIME_ERROR", "the tests define no test method: 0 tests is never a pass")
    outcomes = report.get("outcomes") if isinstance(report.get("outcomes"), dict) else {}
    failed = [name for name in names if outcomes.get(name) != "ok"]
    unreported = [name for name in names if name not in outcomes]
    if module:
        return verdict("MISSING_LIBRARY", str(report.get("problem", "")), len(outcomes), module)
    if not failed:
        return verdict("PASS", "", len(names))
    if unreported and len(unreported) == len(failed):
        return verdict("FAIL", f"{len(unreported)}/{len(names)} tests did not run: {', '.join(unreported[:5])}",
                       len(names) - len(unreported))
    return verdict("FAIL", f"{len(failed)}/{len(names)} tests failed; first: {report.get('problem', '')}", len(names))


def _make_undumpable() -> None:
    """PR_SET_DUMPABLE 0: processes of the same uid cannot ptrace us or open /proc/<pid>/fd|mem."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: nothing to harden
        pass


def _read_report(fd: int, child: object) -> bytes:
    """What the tests' process wrote on the pipe until it exited (forks left holding the pipe are ignored)."""
    import select

    os.set_blocking(fd, False)
    chunks, size = [], 0
    while size <= REPORT_BYTES:
        exited = child.poll() is not None  # type: ignore[attr-defined]
        if not exited:
            select.select([fd], [], [], 0.05)
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            if exited:
                break
            continue
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def main(solution_path: str, tests_path: str) -> None:
    """Run the tests' process on the program, then print the signed verdict."""
    import secrets
    import signal
    import subprocess

    key = sys.stdin.buffer.readline().strip()
    _make_undumpable()
    with open(tests_path, encoding="utf-8") as handle:
        names = expected_tests(handle.read())
    nonce = secrets.token_hex(32)
    read_fd, write_fd = os.pipe()
    nonce_read, nonce_write = os.pipe()
    os.write(nonce_write, nonce.encode())
    os.close(nonce_write)
    with open(OUTPUT_FILE, "wb") as output:
        child = subprocess.Popen(
            [sys.executable, "-B", "-s", os.path.join(os.path.dirname(os.path.abspath(__file__)), PROCESSES_FILE),
             "tests", str(write_fd), str(nonce_read), solution_path, tests_path],
            stdin=subprocess.DEVNULL, stdout=output, stderr=output, pass_fds=(write_fd, nonce_read),
            start_new_session=True,
        )
    os.close(write_fd)
    os.close(nonce_read)
    raw = _read_report(read_fd, child)
    code = child.wait()
    try:
        os.killpg(child.pid, signal.SIGKILL)  # what the program left running in its session
    except (ProcessLookupError, PermissionError):
        pass
    report, authentic = authentic_report(raw, nonce)
    exit_text = f"exit {code}" if code >= 0 else f"signal {-code}"
    payload = json.dumps(decide(report, names, exit_text, authentic))
    sys.stdout.write("\n" + MARKER + sign(key, payload) + " " + payload + "\n")
    sys.stdout.flush()
    os._exit(0)  # nothing of ours to tear down


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
