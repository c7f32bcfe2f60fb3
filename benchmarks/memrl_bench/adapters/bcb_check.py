"""Check one BigCodeBench program inside the sandbox and print an authenticated JSON verdict.

Usage: `python bcb_check.py SOLUTION.py TESTS.py`, with a secret key as the first line of stdin.
Two processes, so that the program under test never holds the verdict's channel:

* the **checker** (this process, `main`) never runs the program's code. It reads the key, makes
  itself non-dumpable (no other process of its uid can read its memory or open its descriptors
  through /proc, nor ptrace it), counts the test methods of `TESTS.py` with `ast`, then starts
  the harness in a fresh interpreter that inherits neither stdin, stdout nor the key: its
  output goes to `program_output.txt`, and only a report pipe is passed. Once the harness has
  exited, the checker decides and prints the verdict as the last stdout line,
  `MARKER <hmac-sha256 hex> <json>`, where the json is
  `{"status": PASS|FAIL|RUNTIME_ERROR|MISSING_LIBRARY, "detail": str, "tests": int, "module": str|null}`.
  A line the key did not sign is a forgery (`memrl_bench.adapters.bigcodebench` scores it FAIL).
* the **harness** (`harness`, in the child) snapshots the test machinery (the `unittest`
  modules and classes, `builtins`), reads and deletes both files, executes the solution as module `__test__` (so
  `if __name__ == "__main__":` blocks stay idle), checks that the machinery is unchanged,
  executes the tests into the same module, runs exactly the test methods found by `ast`
  through references taken before the solution ran, checks the machinery again, and reports
  each test's outcome on the pipe.

The checker passes a program only if the harness reported every expected test, each passed,
and no tampering: 0 tests is never PASS, and an early exit (`sys.exit`, `os._exit`, a crash)
leaves tests unreported. What this cannot stop: code written against this harness that
introspects its own interpreter (frames, gc, descriptors) to forge the report or undo its
patches before the checks; the tests must run in the program's process (docs/guarantees.md).

This file runs standalone (stdlib only) with the candidate's interpreter; the sandbox copies it
into the working directory.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import hmac
import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import traceback
import types
import unittest

MARKER = "@@BCB-VERDICT@@ "
DETAIL_CHARS = 2000
REPORT_BYTES = 1 << 20
OUTPUT_FILE = "program_output.txt"
_PR_SET_DUMPABLE = 4
_WATCHED_PACKAGES = ("unittest", "json")  # the tests' machinery, and the report's serialiser


# --------------------------------------------------------------------------- shared helpers


def sign(key: bytes, payload: str) -> str:
    """The hex HMAC-SHA256 of `payload` under `key`."""
    return hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()


def expected_tests(test_source: str) -> list[str]:
    """Names of the `test*` methods of class `TestCases` in `test_source`, in file order."""
    for node in ast.parse(test_source).body:
        if isinstance(node, ast.ClassDef) and node.name == "TestCases":
            return [item.name for item in node.body
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test")]
    return []


def _class_members(test_source: str) -> set[str]:
    """Every name `TestCases` itself defines in `test_source`."""
    for node in ast.parse(test_source).body:
        if isinstance(node, ast.ClassDef) and node.name == "TestCases":
            names = {item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
            for item in node.body:
                targets = item.targets if isinstance(item, ast.Assign) else [getattr(item, "target", None)]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
            return names
    return set()


def _missing_module(error: BaseException) -> str | None:
    """The top-level module name if `error` is an import of a module not installed here."""
    if not isinstance(error, ModuleNotFoundError) or not error.name:
        return None
    top = error.name.split(".")[0]
    return top if not _installed(top) else None


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _tail(text: str) -> str:
    return text if len(text) <= DETAIL_CHARS else "..." + text[-DETAIL_CHARS:]


# --------------------------------------------------------------------------- the harness (child)


class _Machinery:
    """A snapshot of what the tests and the report rely on: the unittest and json modules and their
    classes, and builtins."""

    def __init__(self) -> None:
        self.modules = {name: module for name, module in sys.modules.items()
                        if name.split(".")[0] in _WATCHED_PACKAGES}
        self.module_dicts = {name: dict(vars(module)) for name, module in self.modules.items()}
        self.classes = {(name, attr): (value, dict(vars(value)))
                        for name, module in self.modules.items() for attr, value in vars(module).items()
                        if isinstance(value, type) and value.__module__.split(".")[0] in _WATCHED_PACKAGES}
        self.builtins = dict(vars(builtins))

    def changes(self) -> list[str]:
        """What differs from the snapshot (added module attributes and builtins are allowed)."""
        found = [f"sys.modules[{name!r}]" for name, module in self.modules.items() if sys.modules.get(name) is not module]
        for name, before in self.module_dicts.items():
            now = vars(self.modules[name])
            found += [f"{name}.{attr}" for attr, value in before.items() if now.get(attr, _GONE) is not value]
        for (module, attr), (cls, before) in self.classes.items():
            now = vars(cls)
            changed = set(before) ^ set(now) | {key for key in before if key in now and now[key] is not before[key]}
            found += [f"{module}.{attr}.{key}" for key in sorted(changed)]
        now_builtins = vars(builtins)
        found += [f"builtins.{name}" for name, value in self.builtins.items()
                  if now_builtins.get(name, _GONE) is not value]
        return found


_GONE = object()


def harness(report_fd: int, solution_path: str, tests_path: str) -> None:
    """Run the solution's tests (see module docstring) and write the report on `report_fd`."""
    write, dumps, exit_now = os.write, json.dumps, os._exit
    machinery = _Machinery()
    test_case, test_suite, test_result = unittest.TestCase, unittest.TestSuite, unittest.TestResult
    suite_run = unittest.TestSuite.run
    with open(solution_path, encoding="utf-8") as handle:
        solution = handle.read()
    with open(tests_path, encoding="utf-8") as handle:
        tests = handle.read()
    for path in (solution_path, tests_path):  # the program finds no test file to read
        os.unlink(path)
    names = expected_tests(tests)
    members = _class_members(tests)
    protected = {name for name in dir(test_case) if callable(getattr(test_case, name, None))}

    class Result(test_result):
        def __init__(self) -> None:
            super().__init__()
            self.outcomes: dict[str, str] = {}
            self.error_exceptions: list[BaseException] = []
            self.first_problem = ""

        def addSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802 (unittest API)
            super().addSuccess(test)
            self.outcomes.setdefault(test._testMethodName, "ok")

        def addFailure(self, test, err) -> None:  # noqa: N802
            super().addFailure(test, err)
            self._problem(test, "fail", self.failures[-1][1])

        def addError(self, test, err) -> None:  # noqa: N802
            super().addError(test, err)
            self.error_exceptions.append(err[1])
            self._problem(test, "error", self.errors[-1][1])

        def addSubTest(self, test, subtest, err) -> None:  # noqa: N802
            super().addSubTest(test, subtest, err)
            if err is not None:
                if not issubclass(err[0], test.failureException):
                    self.error_exceptions.append(err[1])
                kind = "fail" if issubclass(err[0], test.failureException) else "error"
                self._problem(test, kind, self._exc_info_to_string(err, test))

        def addSkip(self, test, reason) -> None:  # noqa: N802
            super().addSkip(test, reason)
            self.outcomes[getattr(test, "_testMethodName", "?")] = "skipped"

        def addExpectedFailure(self, test, err) -> None:  # noqa: N802
            super().addExpectedFailure(test, err)
            self.outcomes[test._testMethodName] = "ok"

        def addUnexpectedSuccess(self, test) -> None:  # noqa: N802
            super().addUnexpectedSuccess(test)
            self._problem(test, "fail", "unexpected success")

        def _problem(self, test, kind: str, text: str) -> None:
            name = getattr(test, "_testMethodName", None) or str(test)
            self.outcomes[name] = kind
            if not self.first_problem:
                self.first_problem = f"{name}: {text}"

    def report(**fields) -> None:
        data = dumps(fields).encode()[:REPORT_BYTES]
        while data:
            data = data[write(report_fd, data):]
        exit_now(0)

    module = types.ModuleType("__test__")
    module.__dict__.update({"__file__": "__test__.py", "sys": sys, "os": os, "environ": os.environ})
    sys.modules["__test__"] = module
    for source, stage in ((solution, "solution"), (tests, "tests")):
        try:
            exec(compile(source, "__test__.py", "exec"), module.__dict__)
        except BaseException as error:  # the program may raise anything, SystemExit included
            detail = "".join(traceback.format_exception(type(error), error, error.__traceback__.tb_next))
            report(stage=stage, error=_tail(detail), module=_missing_module(error))
        changed = machinery.changes()
        if changed:
            report(stage=stage, tampered=changed[:20])
    cases = module.__dict__.get("TestCases")
    if not (isinstance(cases, type) and cases.__mro__[1:] == test_case.__mro__):
        report(stage="tests", error="the program defines no TestCases class deriving directly from unittest.TestCase")
    instances = [cases(name) for name in names]
    result = Result()
    suite_run(test_suite(instances), result)
    changed = machinery.changes()
    changed += [f"TestCases.{name}" for name in sorted(set(vars(cases)) & protected - members)]
    changed += [f"{name}.{attr}" for case, name in zip(instances, names) for attr in sorted(set(vars(case)) & protected)]
    if changed:
        report(stage="run", tampered=changed[:20])
    missing = next(filter(None, map(_missing_module, result.error_exceptions)), None)
    report(stage="run", outcomes=result.outcomes, tests_run=result.testsRun, module=missing,
           problem=_tail(result.first_problem))


# --------------------------------------------------------------------------- the checker (parent)


def decide(report: dict | None, names: list[str], exit_text: str) -> dict:
    """The verdict from the harness's report and the expected test names."""
    def verdict(status: str, detail: str, tests: int = 0, module: str | None = None) -> dict:
        return {"status": status, "detail": _tail(detail), "tests": tests, "module": module}

    if report is None:
        return verdict("RUNTIME_ERROR", f"the program ended before its tests reported ({exit_text})")
    if report.get("tampered"):
        return verdict("FAIL", "the program changed the test machinery: " + ", ".join(map(str, report["tampered"])))
    module = report.get("module")
    if module and _installed(str(module)):  # the harness's claim is checked here, not trusted
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


def _read_report(fd: int, child: subprocess.Popen) -> bytes:
    """What the harness wrote on the pipe until it exited (forks left holding the pipe are ignored)."""
    os.set_blocking(fd, False)
    chunks, size = [], 0
    while size <= REPORT_BYTES:
        exited = child.poll() is not None
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
    """Run the harness on the program, then print the signed verdict."""
    key = sys.stdin.buffer.readline().strip()
    _make_undumpable()
    with open(tests_path, encoding="utf-8") as handle:
        names = expected_tests(handle.read())
    read_fd, write_fd = os.pipe()
    with open(OUTPUT_FILE, "wb") as output:
        child = subprocess.Popen(
            [sys.executable, "-B", os.path.abspath(__file__), "--harness", str(write_fd), solution_path, tests_path],
            stdin=subprocess.DEVNULL, stdout=output, stderr=output, pass_fds=(write_fd,), start_new_session=True,
        )
    os.close(write_fd)
    raw = _read_report(read_fd, child)
    code = child.wait()
    try:
        os.killpg(child.pid, signal.SIGKILL)  # what the program left running in its session
    except (ProcessLookupError, PermissionError):
        pass
    try:
        report = json.loads(raw) if raw else None
    except ValueError:
        report = None
    report = report if isinstance(report, dict) else None
    exit_text = f"exit {code}" if code >= 0 else f"signal {-code}"
    payload = json.dumps(decide(report, names, exit_text))
    sys.stdout.write("\n" + MARKER + sign(key, payload) + " " + payload + "\n")
    sys.stdout.flush()
    os._exit(0)  # nothing of ours to tear down


if __name__ == "__main__":
    if sys.argv[1] == "--harness":
        harness(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    else:
        main(sys.argv[1], sys.argv[2])
