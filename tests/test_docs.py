"""The command reference documents every command and option that `memrl --help` shows, and nothing else:
docs/cli.md is its index, docs/cli/*.md its pages (a `## memrl NAME` section per command); their `--help`
blocks are generated (cog) and current."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer.main

from conftest import unavailable
from memrl_cli.cli import app

DOCS = Path(__file__).resolve().parents[1] / "docs"
COMMANDS = typer.main.get_command(app).commands  # type: ignore[attr-defined]
PAGES = sorted((DOCS / "cli").glob("*.md"))  # the command reference's pages, one per group of commands


def page_sections(page: Path) -> dict[str, str]:
    """`## memrl NAME` sections of one page by command name, hand-written text only (without the
    generated `--help` blocks, which would document every option by construction)."""
    text = re.sub(r"\[\[\[cog.*?\[\[\[end\]\]\]", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    parts = re.split(r"^## memrl (\S+)\s*$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def sections() -> dict[str, str]:
    """Every page's sections by command name (a command documented on two pages fails the first test)."""
    return {name: text for page in PAGES for name, text in page_sections(page).items()}


def where() -> dict[str, str]:
    """Command name → the page (relative to docs/) whose section documents it."""
    return {name: f"cli/{page.name}" for page in PAGES for name in page_sections(page)}


def test_every_command_has_one_section_on_one_page() -> None:
    assert PAGES, "docs/cli/ has no pages"
    found = [name for page in PAGES for name in page_sections(page)]
    assert sorted(found) == sorted(set(found)), f"a command has two sections: {sorted(found)}"
    assert set(found) == set(COMMANDS), "docs/cli/*.md sections differ from the CLI's commands"


def test_the_index_links_every_command_to_its_section() -> None:
    """docs/cli.md lists each command once, linked to the section of the page that documents it."""
    index = (DOCS / "cli.md").read_text(encoding="utf-8")
    links = re.findall(r"\[`memrl ([\w-]+)`\]\(([^)#]+)#memrl-([\w-]+)\)", index)
    assert sorted(name for name, _, _ in links) == sorted(COMMANDS), "docs/cli.md: one linked line per command"
    pages = where()
    for name, page, anchor in links:
        assert (page, anchor) == (pages[name], name), f"docs/cli.md: `memrl {name}` links to {page}#memrl-{anchor}"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_command_has_help_and_documented_options(name: str) -> None:
    command = COMMANDS[name]
    assert command.help and command.help.strip(), f"`memrl {name}` has no help text"
    section = sections().get(name)
    assert section is not None, f"docs/cli/*.md: no page has a '## memrl {name}' section"
    page = f"docs/{where()[name]}"
    assert section.strip(), f"{page}: `memrl {name}` has no prose"
    assert "```sh" in section, f"{page}: `memrl {name}` has no example"
    for param in command.params:
        assert getattr(param, "help", None), f"`memrl {name}`: {param.name} has no help text"
        if param.param_type_name == "argument":
            assert param.name.upper() in section, f"{page}: `memrl {name}` does not document {param.name.upper()}"
        for opt in param.opts:
            if opt.startswith("--"):
                assert opt in section, f"{page}: `memrl {name}` does not document {opt}"


def test_every_command_section_shows_its_generated_help() -> None:
    missing = [name for name in sorted(COMMANDS)
               if f'<!-- [[[cog cli_help("{name}") ]]] -->' not in (DOCS / where().get(name, "cli.md")).read_text()]
    assert not missing, f"docs/cli/*.md: add `<!-- [[[cog cli_help(\"NAME\") ]]] -->` + `<!-- [[[end]]] -->` " \
                        f"under the option table of {missing}, then run `cog -r docs/cli/*.md`"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_generated_help_is_current(page: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`cog --check docs/cli/PAGE.md`: each page defines `cli_help` itself, and every `--help` block is what
    the CLI prints now."""
    try:
        from cogapp import Cog
    except ImportError:
        unavailable("cogapp is not installed (pip install -e '.[dev]')", "cogapp")
    status = Cog().main(["cog", "--check", "--diff", str(page)])
    out = capsys.readouterr()
    assert status == 0, f"docs/cli/{page.name} is stale: run `cog -r docs/cli/*.md`\n{out.out}{out.err}"


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
    """Every selector the CLI pages (docs/cli.md, docs/cli/*.md) name on a `--selector` row is one the CLI
    accepts (docs/cli.md once recommended `conditioned-t`, which the CLI refuses)."""
    from memrl_cli.method.retrieval import SELECTORS

    pages = [DOCS / "cli.md", *sorted((DOCS / "cli").glob("*.md"))]
    rows = [line for page in pages for line in page.read_text(encoding="utf-8").splitlines()
            if line.startswith("| `--selector")]
    named = {name for row in rows for name in re.findall(r"`([a-z][a-z-]*)`", row) if "conditioned" in name or
             name.startswith("memrl")}
    assert len(rows) >= 3 and named and named <= set(SELECTORS), named - set(SELECTORS)
