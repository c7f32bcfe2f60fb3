"""The import rules of docs/architecture.md, checked: the core loads no harness code, the CLI loads
it lazily in one place, the method is pure, and SQL outside the Store may only shrink."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from memrl_cli.bank import MemoryBank

ROOT = Path(__file__).resolve().parents[1]
CORE = sorted((ROOT / "memrl_cli").glob("*.py"))
METHOD = {"retrieve", "learn", "scan", "experience"}  # rule 4: pure, no bank, no Store
# Rule 6 does not hold yet: modules that still run SQL on a bank's connection (docs/architecture.md).
# Remove a module once its SQL moves behind the Store; never add one.
STORE = {"memrl_cli/store.py", "memrl_cli/sqlite.py", "memrl_cli/postgres.py", "memrl_cli/schema.py",
         "memrl_cli/bank.py"}
STORE |= {f"memrl_cli/{part}.py" for part in  # MemoryBank's parts (bank.py is their facade)
          ("connection", "vectors", "index", "calibration", "ingest", "receipts", "ledger")}
SQL_OUTSIDE_THE_STORE = {"memrl_cli/hygiene.py", "memrl_cli/inspection.py", "memrl_cli/report.py",
                         "memrl_cli/runs.py", "memrl_cli/transfer.py", "benchmarks/baselines.py",
                         "benchmarks/learning/table.py", "benchmarks/pg_server.py"}
OWN_DATABASES = {"benchmarks/llb_db.py"}  # SQL on the benchmark's MySQL server, not on a bank
MEASUREMENT = "benchmarks/perf/"  # the performance scripts measure the engines themselves


def imports(path: Path) -> list[tuple[str, str | None, bool]]:
    """(imported module, enclosing function or None, whether at module level) of every import in a file."""
    found: list[tuple[str, str | None, bool]] = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, function, function is None) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.extend((f"{child.module}.{alias.name}" if child.module in ("memrl_cli", "benchmarks")
                              else child.module, function, function is None) for alias in child.names)
            visit(child, function)

    visit(ast.parse(path.read_text(encoding="utf-8")), None)
    return found


def is_harness(module: str) -> bool:
    return module == "benchmarks" or module.startswith("benchmarks.")


def test_the_core_never_imports_the_harness_at_module_level() -> None:
    offending = [f"{path.name}: {module}" for path in CORE for module, _, top in imports(path)
                 if top and is_harness(module)]
    assert not offending, f"memrl_cli imports benchmarks at module level (docs/architecture.md, rule 1): {offending}"


def test_the_cli_loads_the_harness_in_one_place() -> None:
    sites = sorted({(path.name, function, module) for path in CORE for module, function, _ in imports(path)
                    if is_harness(module)})
    assert sites == [("cli.py", "bench", "benchmarks.session")], \
        f"memrl_cli imports benchmarks outside `cli.bench` (docs/architecture.md, rule 2): {sites}"


def test_the_method_modules_are_pure() -> None:
    allowed = {"memrl_cli.errors"} | {f"memrl_cli.{name}" for name in METHOD}
    for name in sorted(METHOD):
        used = {module.split(".", 2)[0] + "." + module.split(".", 2)[1] for module, _, _ in
                imports(ROOT / "memrl_cli" / f"{name}.py") if module.startswith("memrl_cli.")}
        assert used <= allowed, f"memrl_cli/{name}.py imports {sorted(used - allowed)} (docs/architecture.md, rule 4)"


def runs_sql(path: Path) -> bool:
    """Whether a module calls `execute`, `executemany` or `executescript` on anything."""
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr in ("execute", "executemany", "executescript")
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))


def test_no_new_module_runs_sql_outside_the_store() -> None:
    modules = sorted(ROOT.glob("memrl_cli/**/*.py")) + sorted(ROOT.glob("benchmarks/**/*.py"))
    running = {path.relative_to(ROOT).as_posix() for path in modules if runs_sql(path)}
    running = {m for m in running if not m.startswith(MEASUREMENT)}
    new = running - STORE - SQL_OUTSIDE_THE_STORE - OWN_DATABASES
    assert not new, (f"{sorted(new)} run SQL outside the Store (docs/architecture.md, rule 6): use or add a "
                     "MemoryBank/Store method instead")
    moved = SQL_OUTSIDE_THE_STORE - running
    assert not moved, f"{sorted(moved)} no longer run SQL: remove them from SQL_OUTSIDE_THE_STORE and the docs"


LOADED = """
import importlib, json, pkgutil, sys
import memrl_cli
from memrl_cli.cli import main

def harness():
    return sorted(m for m in sys.modules if m == "benchmarks" or m.startswith("benchmarks."))

out, commands = sys.argv[1], json.loads(sys.argv[2])
report, missing = {}, []
for info in pkgutil.iter_modules(memrl_cli.__path__):
    if info.name == "__main__":  # runs the CLI when imported
        continue
    try:
        importlib.import_module(f"memrl_cli.{info.name}")
    except ImportError as exc:  # an optional extra that is not installed
        if exc.name and exc.name.split(".")[0] in ("memrl_cli", "benchmarks"):
            raise
        missing.append(info.name)
report["import every module"] = harness()
for argv in commands:
    sys.argv = ["memrl", *argv]
    try:
        main()
    except SystemExit as exit:
        assert exit.code in (0, None), (argv, exit.code)
    report[" ".join(argv)] = harness()
print(json.dumps({"report": report, "missing": missing}), file=open(out, "w"))
"""


def test_importing_and_running_the_core_loads_no_benchmark_module(tmp_path: Path) -> None:
    """A fresh interpreter imports every module of memrl_cli and runs `memrl --help`, `memrl bench --help`
    and `memrl retrieve` on a bank: no `benchmarks` module is loaded at any step."""
    db = str(tmp_path / "b.db")
    with MemoryBank(db, "external:test:4") as bank:
        bank.ingest("heat an egg", "microwave", "success", vector=[1.0, 0.0, 0.0, 0.0])
    commands = [["--help"], ["bench", "--help"],
                ["retrieve", "warm an egg", "--vector", "[1, 0.1, 0, 0]", "--db", db, "--json"]]
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-c", LOADED, str(out), json.dumps(commands)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"memories": [{"id": 1' in done.stdout.replace("\n", "").replace("  ", "")  # retrieve really ran
    result = json.loads(out.read_text())
    assert list(result["report"]) == ["import every module", "--help", "bench --help", " ".join(commands[2])]
    loaded = {step: modules for step, modules in result["report"].items() if modules}
    assert not loaded, f"benchmark code loaded by the core (docs/architecture.md, rule 3): {loaded}"
    if result["missing"]:
        pytest.skip(f"not importable without their extras: {result['missing']} (the rest was checked)")
