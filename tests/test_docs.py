"""docs/cli.md documents every command and option that `memrl --help` shows, and nothing else; its
`--help` blocks are generated (cog) and current."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer.main

from conftest import unavailable
from memrl_cli.cli import app

DOCS = Path(__file__).resolve().parents[1] / "docs"
COMMANDS = typer.main.get_command(app).commands  # type: ignore[attr-defined]


def sections() -> dict[str, str]:
    """`## memrl NAME` sections of docs/cli.md by command name, hand-written text only (without the
    generated `--help` blocks, which would document every option by construction)."""
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    text = re.sub(r"\[\[\[cog.*?\[\[\[end\]\]\]", "", text, flags=re.DOTALL)
    parts = re.split(r"^## memrl (\S+)\s*$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def test_every_documented_command_exists() -> None:
    assert set(sections()) == set(COMMANDS), "docs/cli.md sections differ from the CLI's commands"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_command_has_help_and_documented_options(name: str) -> None:
    command = COMMANDS[name]
    assert command.help and command.help.strip(), f"`memrl {name}` has no help text"
    section = sections().get(name)
    assert section is not None, f"docs/cli.md has no '## memrl {name}' section"
    assert "```sh" in section, f"docs/cli.md: `memrl {name}` has no example"
    for param in command.params:
        assert getattr(param, "help", None), f"`memrl {name}`: {param.name} has no help text"
        if param.param_type_name == "argument":
            assert param.name.upper() in section, f"docs/cli.md: `memrl {name}` does not document {param.name.upper()}"
        for opt in param.opts:
            if opt.startswith("--"):
                assert opt in section, f"docs/cli.md: `memrl {name}` does not document {opt}"


def test_every_command_section_shows_its_generated_help() -> None:
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    missing = [name for name in sorted(COMMANDS) if f'<!-- [[[cog cli_help("{name}") ]]] -->' not in text]
    assert not missing, f"docs/cli.md: add `<!-- [[[cog cli_help(\"NAME\") ]]] -->` + `<!-- [[[end]]] -->` " \
                        f"under the option table of {missing}, then run `cog -r docs/cli.md`"


def test_the_generated_help_is_current(capsys: pytest.CaptureFixture[str]) -> None:
    """`cog --check docs/cli.md`: every `--help` block is what the CLI prints now."""
    try:
        from cogapp import Cog
    except ImportError:
        unavailable("cogapp is not installed (pip install -e '.[dev]')", "cogapp")
    status = Cog().main(["cog", "--check", "--diff", str(DOCS / "cli.md")])
    out = capsys.readouterr()
    assert status == 0, f"docs/cli.md is stale: run `cog -r docs/cli.md`\n{out.out}{out.err}"


def test_schema_doc_covers_every_table_and_column() -> None:
    import sqlite3

    from memrl_cli.store import migrations as schema

    text = (DOCS / "schema.md").read_text(encoding="utf-8")
    conn = sqlite3.connect(":memory:", isolation_level=None)
    for migration_set in schema.SETS:
        for migration in migration_set.migrations:
            for statement in migration.ddl("sqlite"):
                conn.execute(statement)
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    assert set(tables) | {"memory_index", "meta"} == schema.TABLES
    for table in tables:
        assert f"`{table}`" in text, f"docs/schema.md does not describe table {table}"
        for (column,) in conn.execute(f"SELECT name FROM pragma_table_info('{table}')"):
            assert f"`{column}`" in text, f"docs/schema.md does not describe {table}.{column}"


def test_the_bank_opens_with_sqlite_utils_as_documented(tmp_path: Path) -> None:
    """docs/schema.md promises the file opens with sqlite-utils, and sqlite-vec reads its vectors and optional index."""
    import json
    import subprocess
    import sys

    import sqlite_vec

    from memrl_cli.bank import MemoryBank

    path = tmp_path / "memrl.db"
    with MemoryBank(path, "external:test:3") as bank:
        bank.ingest("heat an egg", "SCRIPT: microwave", "success", vector=[1.0, 0.0, 0.0])
    cli = [sys.executable, "-m", "sqlite_utils"]
    rows = json.loads(subprocess.run(cli + ["rows", str(path), "memories", "-c", "id", "-c", "intent", "-c", "q"],
                                     capture_output=True, text=True, check=True).stdout)
    assert rows == [{"id": 1, "intent": "heat an egg", "q": 0.0}]
    extension = sqlite_vec.loadable_path()
    nearest = subprocess.run(cli + [str(path), "SELECT id, round(vec_distance_cosine(embedding, '[0.6,0.8,0]'), 3) AS d "
                                    "FROM memories ORDER BY d LIMIT 1", "--load-extension", extension],
                             capture_output=True, text=True, check=True)
    assert json.loads(nearest.stdout) == [{"id": 1, "d": 0.4}]  # the stored vectors are sqlite-vec float32 vectors
    with MemoryBank(path) as bank:
        bank.set_index("vec")
    knn = subprocess.run(cli + [str(path), "SELECT memory_id FROM memory_index WHERE embedding MATCH '[1,0,0]' AND k = 1",
                                "--load-extension", extension], capture_output=True, text=True, check=True)
    assert json.loads(knn.stdout) == [{"memory_id": 1}]


def test_ci_installs_exactly_as_the_readme_says_with_a_portable_llama_cpp() -> None:
    """The README's main-job and test commands build llama.cpp portably (a build tuned to the build machine's CPU
    dies with SIGILL on one that refuses its instructions), and .ci/run installs as the README's test line does."""
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    installs = re.findall(r"^python3 -m venv \.venv && \. \.venv/bin/activate && (.+?pip install -e '[^']+')", readme,
                          re.MULTILINE)
    assert len(installs) == 2, installs  # the main job and the tests
    assert all(line.startswith('CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install -e') for line in installs), installs
    ci = (root / ".ci" / "run").read_text()
    assert installs[1].replace("pip install -e", "pip install -q -e") in ci.splitlines()


def test_cli_doc_names_only_selectors_the_cli_takes() -> None:
    """Every selector docs/cli.md names on a `--selector` row is one the CLI accepts (it once recommended
    `conditioned-t`, which the CLI refuses)."""
    from memrl_cli.method.retrieval import SELECTORS

    rows = [line for line in (DOCS / "cli.md").read_text(encoding="utf-8").splitlines() if line.startswith("| `--selector")]
    named = {name for row in rows for name in re.findall(r"`([a-z][a-z-]*)`", row) if "conditioned" in name or
             name.startswith("memrl")}
    assert len(rows) >= 3 and named and named <= set(SELECTORS), named - set(SELECTORS)
