"""The import rules of docs/architecture.md, checked: the core loads no harness code, the CLI loads
it lazily in one place, the method is pure, the installed harness (`memrl_bench`) finds adapters only
through its registry and never needs the repository's own parts, the install holds `memrl_cli` and
`memrl_bench` only, and SQL outside the Store may only shrink."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from memrl_cli.bank import MemoryBank

ROOT = Path(__file__).resolve().parents[1]
CORE_ROOT = ROOT / "memrl_cli"
CORE = sorted(CORE_ROOT.rglob("*.py"))
HARNESS = ROOT / "benchmarks" / "memrl_bench"  # installed as `memrl_bench`
# The harness, installed, and the repository's own parts of benchmarks/ (perf, learning, testing): the core
# imports none of them.
HARNESS_ROOTS = ("memrl_bench", "benchmarks")
# The core's ranks (docs/architecture.md, "The import rule"): a module may import the core only at its own rank
# or below. The rank of a module is that of its package (its first folder under memrl_cli/), or of its own name
# for a top-level module; a new module is governed by where it is put.
RANKS = {"errors": 0, "validators": 0, "method": 1, "store": 2, "bank": 3, "ops": 4, "serving": 5,
         "cli": 6, "__main__": 6, "__init__": 6}
# Rule 4: only the Store runs SQL on a bank (docs/architecture.md).
SQL_FOLDERS = ("memrl_cli/store/",)
STORE_FOLDER = "memrl_cli/store/"
ENGINE_DRIVERS = ("sqlite3", "pysqlite3", "sqlite_vec", "psycopg", "pgvector")  # only the Store imports them
# Test infrastructure, not a bank: the throwaway PostgreSQL server of the tests creates and drops databases.
SQL_OUTSIDE_THE_STORE = {"benchmarks/testing/pg_server.py"}
# SQL on the benchmark's own MySQL server, not on a bank: the folder of the LLB-DB adapter.
OWN_DATABASES = ("benchmarks/memrl_bench/adapters/llb_db/",)
MEASUREMENT = "benchmarks/perf/"  # the performance scripts measure the engines themselves


def rank(path: Path) -> str:
    """The rank name of a module of memrl_cli: its package, or its own name at the top level."""
    parts = path.relative_to(CORE_ROOT).parts
    return parts[0] if len(parts) > 1 else path.stem


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
                found.extend((f"{child.module}.{alias.name}" if is_module(f"{child.module}.{alias.name}")
                              else child.module, function, function is None) for alias in child.names)
            visit(child, function)

    visit(ast.parse(path.read_text(encoding="utf-8")), None)
    return found


def is_module(module: str) -> bool:
    """Whether a dotted name is a module or package of the project (so `from A import B` imports `A.B`), not a
    name defined in a module."""
    path = module.replace(".", "/")
    return any((base / f"{path}.py").is_file() or (base / path / "__init__.py").is_file()
               for base in (ROOT, ROOT / "benchmarks")) or module.startswith("benchmarks.") and module.count(".") == 1


def is_harness(module: str) -> bool:
    return module.split(".")[0] in HARNESS_ROOTS


def test_the_core_never_imports_the_harness_at_module_level() -> None:
    offending = [f"{path.relative_to(ROOT)}: {module}" for path in CORE for module, _, top in imports(path)
                 if top and is_harness(module)]
    assert not offending, f"memrl_cli imports the harness at module level (docs/architecture.md, rule 1): {offending}"


def test_the_cli_loads_the_harness_in_one_place() -> None:
    sites = sorted({(path.relative_to(CORE_ROOT).as_posix(), function, module) for path in CORE for module, function, _ in imports(path)
                    if is_harness(module)})
    assert sites == [("cli.py", "bench", "memrl_bench.framework.session")], \
        f"memrl_cli imports the harness outside `cli.bench` (docs/architecture.md, rule 2): {sites}"


def core_imports(path: Path) -> set[str]:
    """The ranks of memrl_cli that a module of memrl_cli imports (anywhere in it, lazily too)."""
    return {module.split(".")[1] for module, _, _ in imports(path)
            if module.startswith("memrl_cli.") and module.split(".")[1] != "__version__"}


def test_every_core_module_has_a_rank() -> None:
    """A module put in a new folder, or a new top-level module, is given a rank in RANKS and in the table of
    docs/architecture.md before it is governed by the rule (so nothing goes unchecked)."""
    unranked = sorted({rank(path) for path in CORE} - set(RANKS))
    assert not unranked, f"memrl_cli/{unranked}: give them a rank (RANKS here and docs/architecture.md's table)"
    assert len(CORE) > 40, CORE  # the walk really sees the sub-packages


def test_the_core_imports_only_its_own_rank_or_below() -> None:
    """The import rule by package rank (docs/architecture.md): the method (pure) imports only errors and
    validators; the Store only the method; the bank the Store; operations the bank; serving the operations;
    the CLI anything. So the method never reaches a bank or a driver, and the Store never reaches MemoryBank."""
    offending = [f"{path.relative_to(ROOT)} (rank {rank(path)}) imports memrl_cli.{target}"
                 for path in CORE for target in sorted(core_imports(path))
                 if RANKS.get(target, 99) > RANKS[rank(path)]]
    assert not offending, f"imports above a module's rank (docs/architecture.md, the import rule): {offending}"


def test_only_the_store_imports_an_engine_driver() -> None:
    offending = [f"{path.relative_to(ROOT)}: {module}" for path in CORE if rank(path) != "store"
                 for module, _, _ in imports(path) if module.split(".")[0] in ENGINE_DRIVERS]
    assert not offending, f"an engine's driver imported outside memrl_cli/store/ (rule 6): {offending}"


def harness_modules(role: str) -> list[Path]:
    return sorted((HARNESS / role).rglob("*.py"))


def test_the_harness_finds_adapters_only_through_its_registry() -> None:
    """The framework and the environments never import an adapter: a benchmark is one module plus one
    entry point (docs/bench.md), found by `memrl_bench.framework.registry`."""
    offending = [f"{path.relative_to(ROOT)}: {module}" for role in ("framework", "environments")
                 for path in harness_modules(role) for module, _, _ in imports(path)
                 if module.startswith("memrl_bench.adapters")]
    assert not offending, f"the harness imports an adapter (docs/architecture.md, rule 5): {offending}"


# Rule 5: what the harness imports of the core (docs/architecture.md): the public names and the pure method.
HARNESS_USES = {"memrl_cli", "memrl_cli.errors", "memrl_cli.validators", "memrl_cli.bank", "memrl_cli.method",
                "memrl_cli.ops.runs"}


def test_the_harness_uses_the_cores_public_names() -> None:
    def allowed(module: str) -> bool:
        return module in HARNESS_USES or module.startswith("memrl_cli.method.")
    offending = sorted({f"{path.relative_to(ROOT)}: {module}" for path in HARNESS.rglob("*.py")
                        for module, _, _ in imports(path) if module.split(".")[0] == "memrl_cli" and not allowed(module)})
    assert not offending, f"the harness imports the core beyond its public names (docs/architecture.md, rule 5): {offending}"


def test_the_installed_harness_needs_nothing_from_the_repository() -> None:
    """`memrl_bench` is installed; benchmarks/perf, benchmarks/learning, benchmarks/testing and tests/ are
    not: it never imports them, and nothing under benchmarks/ puts a folder on `sys.path`."""
    installed = sorted(HARNESS.rglob("*.py"))
    assert len(installed) > 20, installed  # the walk really sees the harness
    offending = [f"{path.relative_to(ROOT)}: {module}" for path in installed for module, _, _ in imports(path)
                 if module.split(".")[0] in ("benchmarks", "tests", "conftest", "bench_data", "served")]
    assert not offending, f"memrl_bench imports a part of the repository that is not installed (rule 7): {offending}"
    edits = [path.relative_to(ROOT).as_posix() for path in sorted((ROOT / "benchmarks").rglob("*.py"))
             if "sys.path." in path.read_text(encoding="utf-8")]
    assert not edits, f"{edits} edit sys.path: import the repository's parts as benchmarks.testing etc."


def runs_sql(path: Path) -> bool:
    """Whether a module calls `execute`, `executemany` or `executescript` on anything."""
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr in ("execute", "executemany", "executescript")
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))


def test_no_new_module_runs_sql_outside_the_store() -> None:
    modules = sorted(ROOT.glob("memrl_cli/**/*.py")) + sorted(ROOT.glob("benchmarks/**/*.py"))
    running = {path.relative_to(ROOT).as_posix() for path in modules if runs_sql(path)}
    running = {m for m in running if not m.startswith(MEASUREMENT)}
    new = {m for m in running - SQL_OUTSIDE_THE_STORE if not m.startswith(SQL_FOLDERS + OWN_DATABASES)}
    assert not new, (f"{sorted(new)} run SQL outside the Store (docs/architecture.md, rule 6): use or add a "
                     "MemoryBank/Store method instead")
    moved = SQL_OUTSIDE_THE_STORE - running
    assert not moved, f"{sorted(moved)} no longer run SQL: remove them from SQL_OUTSIDE_THE_STORE and the docs"


LOADED = """
import importlib, json, pkgutil, sys
import memrl_cli
from memrl_cli.cli import main

def harness():
    return sorted(m for m in sys.modules if m.split(".")[0] in ("memrl_bench", "benchmarks"))

out, commands = sys.argv[1], json.loads(sys.argv[2])
report, missing = {}, []
for info in pkgutil.walk_packages(memrl_cli.__path__, "memrl_cli."):
    if info.name == "memrl_cli.__main__":  # runs the CLI when imported
        continue
    try:
        importlib.import_module(info.name)
    except ImportError as exc:  # an optional extra that is not installed
        if exc.name and exc.name.split(".")[0] in ("memrl_cli", "memrl_bench", "benchmarks"):
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
    and `memrl retrieve` on a bank: no `memrl_bench` (or `benchmarks`) module is loaded at any step."""
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


FIND = """
import importlib.util, json, sys
print(json.dumps({name: (spec.origin if (spec := importlib.util.find_spec(name)) else None)
                  for name in sys.argv[1:]}))
"""


def test_every_package_folder_is_installed() -> None:
    """pyproject.toml lists the packages a wheel holds: every folder with an `__init__.py` under memrl_cli/ and
    benchmarks/memrl_bench/ (a new sub-package not listed would be missing from `pip install .`)."""
    tomllib = pytest.importorskip("tomllib", reason="needs Python 3.11+ to read pyproject.toml")
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(init.parent.relative_to(base).parts) for base in (ROOT, ROOT / "benchmarks")
             for top in ("memrl_cli", "memrl_bench") for init in (base / top).rglob("__init__.py")
             if (base / top).is_dir() and ".venv" not in init.parts}
    assert found - listed == set(), f"add to [tool.setuptools] packages in pyproject.toml: {sorted(found - listed)}"


def test_the_install_exposes_memrl_cli_and_memrl_bench_only(tmp_path: Path) -> None:
    """An interpreter outside the checkout (isolated: no PYTHONPATH, no current directory on the path)
    imports `memrl_cli` and `memrl_bench` from this checkout's install, and no top-level `benchmarks`:
    the repository's own parts of benchmarks/ stay out of site-packages, where the name would collide."""
    done = subprocess.run([sys.executable, "-I", "-c", FIND, "memrl_cli", "memrl_bench", "benchmarks"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["benchmarks"] is None, f"the install exposes a top-level `benchmarks` (rule 7): {found['benchmarks']}"
    assert found["memrl_bench"] and found["memrl_cli"], f"not installed (pip install -e .): {found}"
    if Path(found["memrl_cli"]).is_relative_to(ROOT):  # an editable install of this checkout
        assert Path(found["memrl_bench"]) == HARNESS / "__init__.py", found


def compares_store_kind(path: Path) -> bool:
    """Whether a module compares a Store's `kind` (`store.kind == "sqlite"` and the like)."""
    def is_kind(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "kind" and (
            isinstance(node.value, ast.Attribute) and node.value.attr == "store"
            or isinstance(node.value, ast.Name) and node.value.id == "store")
    return any(isinstance(node, ast.Compare) and any(map(is_kind, [node.left, *node.comparators]))
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))


def test_only_the_store_tests_the_engine() -> None:
    modules = sorted(ROOT.glob("memrl_cli/**/*.py")) + sorted(ROOT.glob("benchmarks/**/*.py"))
    testing = sorted(path.relative_to(ROOT).as_posix() for path in modules
                     if not path.relative_to(ROOT).as_posix().startswith(STORE_FOLDER) and compares_store_kind(path))
    assert not testing, f"{testing} test `store.kind` (docs/architecture.md, rule 6): add a Store method instead"


def test_the_schema_knows_no_engine_module() -> None:
    """migrations.py (the migrations of both engines) imports neither engine; the engines import it."""
    used = {module for module, _, _ in imports(CORE_ROOT / "store" / "migrations.py") if module.startswith("memrl_cli")}
    assert used <= {"memrl_cli.errors"}, f"memrl_cli/store/migrations.py imports {sorted(used)}"


def test_the_cli_calls_one_entry_point_of_the_harness() -> None:
    """Rule 2: `cli.bench` uses one name of the session it imports (`run_from_cli`, which owns the bench
    options), so the harness can change how it reads them without touching the CLI."""
    tree = ast.parse((ROOT / "memrl_cli" / "cli.py").read_text(encoding="utf-8"))
    bench = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "bench")
    used = {node.attr for node in ast.walk(bench) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id == "session"}
    assert used == {"run_from_cli"}, f"cli.bench uses {sorted(used)} of the harness's session (docs/architecture.md, rule 2)"


# Modules allowed past MAX_LINES, each with its reason (docs/architecture.md, "Long modules", lists them).
LONG_MODULES = {
    "memrl_cli/cli.py": "the command line whole: one Typer command per subcommand, each a few lines over a library "
                        "function (as in llm and sqlite-utils)",
}
STANDALONE = "Runs standalone"  # the docstring of a script the harness runs by path says so, and it stays whole
MAX_LINES = 450


def test_no_module_is_longer_than_a_reader_can_take_in() -> None:
    modules = sorted(CORE_ROOT.rglob("*.py")) + sorted(HARNESS.rglob("*.py"))
    long = {path.relative_to(ROOT).as_posix(): n for path in modules
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    standalone = {name for name in long if STANDALONE in (ast.get_docstring(ast.parse((ROOT / name).read_text())) or "")}
    unexplained = sorted(set(long) - set(LONG_MODULES) - standalone)
    assert not unexplained, f"modules over {MAX_LINES} lines: {[(m, long[m]) for m in unexplained]}: split them by concept"
