"""The `memrl` command line, run as real subprocesses: JSON contracts, errors, exit codes.

Tests that take `bank_at` (or the `bank` fixture) run on SQLite and on PostgreSQL, with the bank
given as `--db PATH|URL` or `MEMRL_DB`; the rest are about the SQLite file and sqlite-vec.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import pytest

from conftest import error_line, run_memrl
from memrl_cli.bank import MemoryBank
from memrl_cli.errors import MemrlError

MEMORY_KEYS = {"id", "intent", "experience", "outcome", "similarity", "q", "score"}


def memrl(db: str | Path | None, *args: str, **options: Any) -> subprocess.CompletedProcess[str]:
    """`run_memrl(ARGS --db DB)` (no `--db` when `db` is None: MEMRL_DB only when `env` sets it)."""
    return run_memrl(*args, *(["--db", str(db)] if db is not None else []), **options)


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    """The one JSON object a --json command prints: stdout must hold nothing else."""
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    return json.loads(lines[0])


def table_state(db: str) -> tuple:
    """Everything a failed command must not change."""
    with MemoryBank(db, create=False) as bank:
        return ([tuple(r) for r in bank.conn.execute("SELECT id, q, visits, intent FROM memories ORDER BY id")],
                bank.conn.execute("SELECT count(*) FROM rewards").fetchone()[0],
                bank.conn.execute("SELECT count(*) FROM retrievals").fetchone()[0])


LINES = [{"intent": "heat an apple in the microwave", "experience": "take apple; microwave 1; heat",
          "outcome": "success"},
         {"intent": "heat a potato in the microwave", "experience": "take potato; microwave 1; heat"},
         {"intent": "cool a tomato in the fridge", "experience": "take tomato; fridge 1; cool"},
         {"intent": "list the files in /tmp", "experience": "ls /tmp"}]


@pytest.fixture
def bank(bank_at: Callable[[str], str]) -> str:
    """A bank with four memories (local embedder), made in-process to keep the suite fast."""
    db = bank_at("cli")
    with MemoryBank(db) as made:
        made.ingest_many(LINES)
    return db


@pytest.fixture
def sqlite_bank(tmp_path: Path) -> Path:
    """The `bank` fixture's memories in a SQLite file, for tests of the file and sqlite-vec."""
    db = tmp_path / "cli.db"
    with MemoryBank(db) as made:
        made.ingest_many(LINES)
    return db


def test_ingest_jsonl_from_stdin(bank_at: Callable[[str], str]) -> None:
    done = memrl(bank_at("new"), "ingest", "--jsonl", "-", "--json",
                 stdin="".join(json.dumps(x) + "\n" for x in LINES))
    assert as_json(done) == {"created": 4, "duplicates": 0, "ids": [1, 2, 3, 4]}


@pytest.mark.slow
def test_ingest_retrieve_reward_inspect_flow(bank: str, tmp_path: Path) -> None:
    single = memrl(bank, "ingest", "--intent", "warm up some milk", "--experience", "use the microwave",
                   "--outcome", "failure", "--task-id", "t-7", "--json")
    assert as_json(single) == {"id": 5, "created": True} and single.stderr == ""
    duplicate = memrl(bank, "ingest", "--intent", "warm up some milk", "--experience", "use the microwave", "--json")
    assert as_json(duplicate) == {"id": 5, "created": False}
    jsonl = tmp_path / "more.jsonl"
    jsonl.write_text(json.dumps({"intent": "wash a plate", "experience": "sink", "task_id": 12}) + "\n\n")
    [washed] = as_json(memrl(bank, "ingest", "--jsonl", str(jsonl), "--json"))["ids"]
    assert washed > 5  # ids are not dense on PostgreSQL: the duplicate above used up a sequence value

    found = memrl(bank, "retrieve", "heat an apple", "--k1", "4", "--k2", "3", "--lambda", "0.5",
                  "--threshold", "-1", "--epsilon", "0", "--json")
    hit = as_json(found)
    assert found.stderr == ""
    assert set(hit) == {"retrieval_id", "query", "memories"} and hit["query"] == "heat an apple"
    assert len(hit["memories"]) == 3 and all(set(m) == MEMORY_KEYS for m in hit["memories"])
    scores = [m["score"] for m in hit["memories"]]
    assert scores == sorted(scores, reverse=True)
    assert hit["memories"][0]["id"] == 1 and hit["memories"][0]["outcome"] == "success"
    with MemoryBank(bank, create=False) as reader:  # full float precision: JSON equals the stored doubles
        conn = reader.conn
        stored = dict(conn.execute("SELECT memory_id, similarity FROM retrieval_candidates WHERE retrieval_id = ?",
                                   (hit["retrieval_id"],)).fetchall())
        params = json.loads(conn.execute("SELECT params FROM retrievals WHERE id = ?",
                                         (hit["retrieval_id"],)).fetchone()[0])
    assert all(m["similarity"] == stored[m["id"]] for m in hit["memories"])
    assert params["epsilon"] == 0.0 and params["threshold"] == -1.0

    rewarded = as_json(memrl(None, "reward", "--retrieval", str(hit["retrieval_id"]), "--reward", "1",
                             "--alpha", "0.25", "--json", env={"MEMRL_DB": bank}))
    assert rewarded == {"updated": [{"id": m["id"], "q_before": 0.0, "q_after": 0.25} for m in hit["memories"]]}
    before = table_state(bank)
    again = memrl(bank, "reward", "--retrieval", str(hit["retrieval_id"]), "--reward", "1", ok=False)
    assert "already rewarded; pass --allow-repeat" in error_line(again)
    assert table_state(bank) == before
    repeat = as_json(memrl(bank, "reward", "--retrieval", str(hit["retrieval_id"]), "--reward", "-1",
                           "--allow-repeat", "--json"))
    assert [u["q_after"] for u in repeat["updated"]] == [0.25 + 0.3 * (-1 - 0.25)] * 3
    single_reward = as_json(memrl(bank, "reward", "--memory", str(washed), "--reward", "0.7", "--json"))
    assert single_reward == {"updated": [{"id": washed, "q_before": 0.0, "q_after": 0.3 * 0.7}]}

    top = as_json(memrl(None, "inspect", "--top-q", "2", "--json", env={"MEMRL_DB": bank}))["memories"]
    unrewarded = min(set(range(1, 6)) - {m["id"] for m in hit["memories"]})
    assert [(m["id"], m["q"], m["visits"]) for m in top] == [(washed, 0.3 * 0.7, 1), (unrewarded, 0.0, 0)]
    assert top[0]["task_id"] == "12"
    stats = as_json(memrl(bank, "inspect", "--stats", "--json"))
    assert stats["count"] == 6 and stats["rewards"] == 7 and stats["embedder"]["spec"] == "local"
    verify = as_json(memrl(bank, "inspect", "--verify", "--json"))
    assert verify["ok"] and verify["ledger_rows"] == 7
    explained = as_json(memrl(bank, "explain", str(hit["retrieval_id"]), "--json"))
    assert explained["explored"] is False and len(explained["candidates"]) == 4
    assert [c["memory_id"] for c in explained["candidates"] if c["selected_rank"] is not None] == \
        [m["id"] for m in hit["memories"]]
    human = memrl(bank, "inspect", "--top-q", "2")
    assert "top 2 by Q" in human.stdout


@pytest.mark.parametrize("args, message", [
    (["reward", "--memory", "1", "--reward", "nan"], "finite"),
    (["reward", "--memory", "1", "--reward", "inf"], "finite"),
    (["reward", "--memory", "1", "--reward", "lots"], "must be a finite number"),
    (["reward", "--memory", "99", "--reward", "1"], "unknown memory id 99"),
    (["reward", "--retrieval", "99", "--reward", "1"], "unknown retrieval id 99"),
    (["retrieve", "apple", "--threshold", "1.5"], "threshold must be a number in [-1, 1]"),
    (["retrieve", "apple", "--k1", "abc"], "Invalid value for '--k1'"),
    (["inspect", "--memory", "99"], "unknown memory id 99"),
])
def test_errors_are_one_line_and_change_nothing(bank: str, args: list[str], message: str) -> None:
    before = table_state(bank)
    assert message in error_line(memrl(bank, *args, ok=False))
    assert table_state(bank) == before


def test_json_errors_go_to_stdout_as_json(bank: str) -> None:
    done = memrl(bank, "reward", "--memory", "1", "--reward", "nan", "--json", ok=False)
    assert done.returncode == 1
    assert as_json(done)["error"]["type"] == "MemrlError"


def test_jsonl_with_a_bad_line_names_it_and_writes_nothing(bank: str, tmp_path: Path) -> None:
    before = table_state(bank)
    lines = [json.dumps({"intent": f"new task {i}", "experience": "x"}) for i in range(5)]
    for bad, message in (('{"intent": "broken"', "line 3: invalid JSON"),
                         (json.dumps({"intent": "x", "experience": "y", "outcome": "maybe"}),
                          "line 3: outcome must be one of success, failure, unknown")):
        path = tmp_path / "batch.jsonl"
        path.write_text("\n".join(lines[:2] + [bad] + lines[2:]) + "\n")
        assert message in error_line(memrl(bank, "ingest", "--jsonl", str(path), ok=False))
    assert table_state(bank) == before


def test_missing_bank_and_embedder_mismatch(bank: str, bank_at: Callable[[str], str]) -> None:
    absent = bank_at("absent")  # SQLite: no file; PostgreSQL: an empty database
    assert re.search("no (memrl )?bank at", error_line(memrl(absent, "retrieve", "apple", ok=False)))
    with pytest.raises(MemrlError, match="no (memrl )?bank at"):  # the failed command created nothing
        MemoryBank(absent, create=False)
    other = memrl(bank, "ingest", "--intent", "a", "--experience", "b", "--embedder", "openai:some-model", ok=False)
    assert "made with embedder 'local', not 'openai:some-model'" in error_line(other)


def test_opt_in_vec_index_and_the_numpy_fallback_agree(sqlite_bank: Path) -> None:
    bank = sqlite_bank
    args = ["retrieve", "warm an apple", "--threshold", "0", "--json"]
    scanned = memrl(bank, *args, "--no-record")
    built = as_json(memrl(bank, "doctor", "--index", "vec", "--json"))
    assert built["index"] == {"kind": "vec", "sqlite_vec": True, "reason": None, "state": "ok", "indexed": 4}
    assert built["engine"] == "sqlite" and built["ok"]
    with_vec = memrl(bank, *args)
    fallback = memrl(bank, *args, "--no-record", env={"MEMRL_DISABLE_VEC": "1"})
    assert with_vec.stderr == "" and scanned.stderr == ""
    assert as_json(scanned)["memories"] == as_json(fallback)["memories"]
    assert "the bank's sqlite-vec index is unusable, retrieving by numpy scan: disabled by MEMRL_DISABLE_VEC=1" \
        in fallback.stderr
    a, b = as_json(with_vec), as_json(fallback)
    assert b["retrieval_id"] is None and [m["id"] for m in a["memories"]] == [m["id"] for m in b["memories"]]
    with sqlite3.connect(bank) as conn:  # ε defaults to 0: no exploration unless asked for
        params, explored = conn.execute("SELECT params, explored FROM retrievals").fetchone()
    assert json.loads(params)["epsilon"] == 0.0 and explored == 0
    assert [m["similarity"] for m in a["memories"]] == pytest.approx([m["similarity"] for m in b["memories"]],
                                                                     abs=1e-6)


SAME_INTENT = "heat an egg and put it on the table"
# The index each engine offers besides its default (SQLite: the numpy scan; PostgreSQL: the exact scan).
OTHER_INDEX = {"sqlite": "vec", "postgresql": "hnsw"}


@pytest.mark.parametrize("index", ["default", "other"])
def test_the_newest_of_identical_memories_is_retrieved(bank_at: Callable[[str], str], index: str) -> None:
    """Three memories with one intent, each ingested by its own `memrl ingest` process: similarity-only retrieval
    (`--lambda 0 --k2 1`) returns the newest for the intent itself and for paraphrases, on every engine and
    index, in another process each time: their similarities differ only by float32 rounding, which depends on
    the row a memory holds, and that is no difference (issue 41: ties that are ties)."""
    db = bank_at("ties")
    for attempt in (1, 2, 3):
        memrl(db, "ingest", "--intent", SAME_INTENT, "--experience", f"attempt {attempt}", "--outcome", "success")
    if index == "other":
        engine = "postgresql" if db.startswith("postgresql") else "sqlite"
        assert as_json(memrl(db, "doctor", "--index", OTHER_INDEX[engine], "--json"))["index"]["kind"] == \
            OTHER_INDEX[engine]
    for query in (SAME_INTENT, "warm up an egg", "put an egg on the table", "heat egg"):
        for lam in ("0", "0.5"):
            found = as_json(memrl(db, "retrieve", query, "--lambda", lam, "--k2", "1", "--json"))
            assert [m["experience"] for m in found["memories"]] == ["attempt 3"], (query, lam, found)
        explained = as_json(memrl(db, "explain", str(found["retrieval_id"]), "--json"))
        assert {c["z_sim"] for c in explained["candidates"]} == {0.0}, explained["candidates"]


def test_untrusted_and_newer_banks_are_refused(sqlite_bank: Path) -> None:
    bank = sqlite_bank
    with sqlite3.connect(bank) as conn:
        conn.execute("CREATE VIEW winners AS SELECT * FROM memories WHERE q > 0")
    viewed = memrl(bank, "inspect", "--stats", "--json")
    assert as_json(viewed)["count"] == 4
    assert "warning: ignoring view 'winners'" in viewed.stderr
    with sqlite3.connect(bank) as conn:
        conn.execute("CREATE TRIGGER t AFTER INSERT ON rewards BEGIN UPDATE memories SET q = 1; END")
    assert "refusing to open a bank with triggers" in error_line(memrl(bank, "inspect", "--stats", ok=False))
    with sqlite3.connect(bank) as conn:
        conn.execute("DROP TRIGGER t")
        conn.execute("PRAGMA user_version = 999")
    assert "schema version 999, newer than this memrl" in error_line(memrl(bank, "inspect", ok=False))


@pytest.mark.slow
def test_export_import_merge_backup_calibrate_doctor(sqlite_bank: Path, tmp_path: Path) -> None:
    bank = sqlite_bank
    hit = as_json(memrl(bank, "retrieve", "heat an apple", "--threshold", "0", "--json"))
    memrl(bank, "reward", "--retrieval", str(hit["retrieval_id"]), "--reward", "1")
    exported = tmp_path / "bank.jsonl"
    memrl(bank, "export", "--vectors", "-o", str(exported))
    assert len(exported.read_text().splitlines()) == 5
    other = tmp_path / "other.db"
    assert as_json(memrl(other, "import", str(exported), "--json")) == {"created": 4, "duplicates": 0, "merged": 0}
    memrl(other, "ingest", "--intent", "open the window", "--experience", "walk to window; open", "--json")
    memrl(other, "reward", "--memory", "1", "--reward", "-1")

    merged = tmp_path / "merged.db"
    counts = as_json(memrl(None, "merge", str(bank), str(other), "-o", str(merged), "--json"))
    assert counts == {"created": 1, "duplicates": 0, "merged": 4}
    assert as_json(memrl(merged, "inspect", "--verify", "--json"))["ok"]
    stats = as_json(memrl(merged, "inspect", "--stats", "--json"))
    assert stats["count"] == 5

    copy = tmp_path / "backup.db"
    assert as_json(memrl(bank, "backup", str(copy), "--json"))["path"] == str(copy)
    fixed = as_json(memrl(copy, "calibrate", "--mean", "0.2", "--std", "0.1", "--json"))
    assert fixed["used"] == {"mean": 0.2, "std": 0.1}
    cleared = as_json(memrl(copy, "calibrate", "--clear", "--json"))
    assert cleared["override"] is None and cleared["used"]["mean"] == cleared["stats"]["mean"]
    absent = memrl(copy, "doctor", "--rebuild-index", ok=False)  # new banks have no sqlite-vec index
    assert "has no sqlite-vec index to rebuild (build one with `memrl doctor --index vec`)" in error_line(absent)
    built = as_json(memrl(copy, "doctor", "--index", "vec", "--json"))
    assert built["ok"] and built["index"]["indexed"] == 4
    doctor = as_json(memrl(copy, "doctor", "--rebuild-index", "--json"))
    assert doctor["ok"] and doctor["reindexed"] == 4 and doctor["sqlite_vec"] is True


# -- what a newcomer trips over (issue 16) -------------------------------------------------------


@pytest.mark.slow
def test_version_export_json_and_singular_counts(tmp_path: Path) -> None:
    from memrl_cli import __version__

    assert memrl(None, "--version").stdout == f"memrl {__version__}\n"
    db = tmp_path / "b.db"
    ingested = memrl(db, "ingest", "--intent", "heat an egg", "--experience", "microwave", "--outcome", "success")
    assert ingested.stdout.strip() == "memory 1 created"
    assert "retrieval 1: 1 memory " in memrl(db, "retrieve", "warm up an egg", env={"COLUMNS": "80"}).stdout
    out = tmp_path / "bank.jsonl"
    assert as_json(memrl(db, "export", "-o", str(out), "--json")) == {"path": str(out), "memories": 1}
    assert memrl(db, "export", "-o", str(out)).stderr == f"exported 1 memory to {out}\n"
    refused = memrl(db, "export", "--json", ok=False)
    assert refused.returncode == 1 and "needs -o FILE" in as_json(refused)["error"]["message"]
    imported = memrl(tmp_path / "c.db", "import", str(out))
    assert imported.stdout.strip() == "imported 1 memory, 0 duplicates skipped, 0 merged"


@pytest.mark.slow
def test_tables_fit_80_columns_without_breaking_numbers_or_headers(tmp_path: Path) -> None:
    db = tmp_path / "b.db"
    memrl(db, "ingest", "--intent", "heat an egg and put it on the dining table in the kitchen of the house",
          "--experience", "SCRIPT: take egg from fridge 1; go to microwave 1; heat egg with microwave 1; "
          "go to diningtable 1; put egg in/on diningtable 1", "--outcome", "success")
    memrl(db, "retrieve", "warm up an egg, then place it on the dining table")
    env = {"COLUMNS": "80"}
    for args, headers in ((["inspect", "--top-q", "5"], ["visits", "outcome", "0.0000"]),
                          (["explain", "1"], ["memory_id", "similarity", "score"]),
                          (["inspect", "--memory", "1"], ["retrieval_id", "similarity", "selected_rank"]),
                          (["retrieve", "warm an egg"], ["similarity", "outcome", "score"])):
        text = memrl(db, *args, env=env).stdout
        rendered = [line for line in text.splitlines() if not line.startswith(("intent: ", "SCRIPT: "))]  # free text
        assert max(map(len, rendered)) <= 80, text
        for header in headers:
            assert header in text, f"{args}: {header} broke:\n{text}"
    assert "selected: score rank 0 < k2=3" in memrl(db, "explain", "1", env={"COLUMNS": "200"}).stdout


def test_a_file_that_is_not_sqlite_is_not_called_a_corrupt_bank(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("shopping list\n" * 50)
    line = error_line(memrl(notes, "inspect", "--stats", ok=False))
    assert "is not a memrl bank: not a SQLite database" in line and "check --db / MEMRL_DB" in line


# -- a CLI with manners (issue 34, item 6) -------------------------------------------------------------------

def _invoke(*args: str, width: int = 80) -> Any:
    """`memrl ARGS` in this process, `width` columns wide (CliRunner: the command's own help and code)."""
    from typer.testing import CliRunner

    from memrl_cli.cli import app

    return CliRunner().invoke(app, list(args), prog_name="memrl", terminal_width=width, max_content_width=width,
                              env={"MEMRL_DB": None})


def _commands() -> dict[str, Any]:
    import typer.main

    from memrl_cli.cli import app

    return typer.main.get_command(app).commands  # type: ignore[attr-defined]


def test_every_help_has_examples_typed_metavars_and_works_as_h_and_help_command() -> None:
    """Every registered command (so every new one too): an Examples section of `memrl NAME` lines; every option
    that takes a value shows an upper-case metavar (INTEGER, FLOAT, NUMBER, TEXT, FILE, ...), never `<str>`;
    `memrl NAME -h` and `memrl help NAME` print exactly `memrl NAME --help`."""
    for name, command in _commands().items():
        shown = _invoke(name, "--help")
        assert shown.exit_code == 0, shown.output
        text = shown.stdout
        examples = text.partition("\nExamples:\n")[2].splitlines()
        assert examples and all(line.startswith(f"  memrl {name}") or line.startswith("  cat ") for line in examples), \
            f"`memrl {name} --help` has no Examples section of `memrl {name} ...` lines:\n{text}"
        assert not re.search(r"<(str|int|float|list|bool)", text), f"`memrl {name} --help` shows a Python type:\n{text}"
        for param in command.params:
            if param.param_type_name == "option" and not param.is_flag and not param.hidden:
                assert re.fullmatch(r"[A-Z][A-Z_=|:.-]*(\|[a-z]+)?", param.metavar or ""), (name, param.name, param.metavar)
                number = param.type_descriptor.annotation in (int, float, Optional[int], Optional[float])
                assert not number or param.metavar in ("INTEGER", "FLOAT"), (name, param.name, param.metavar)
        assert _invoke(name, "-h").stdout == text, f"`memrl {name} -h` differs from --help"
        assert _invoke("help", name).stdout == text, f"`memrl help {name}` differs from `memrl {name} --help`"
    assert _invoke("-h").stdout == _invoke("--help").stdout == _invoke("help").stdout
    assert "\nExamples:\n  memrl ingest " in _invoke("--help").stdout  # memrl's own help too
    numbers = {(c, p.name): p.metavar for c, command in _commands().items() for p in command.params}
    assert numbers[("reward", "reward_value")] == numbers[("ingest", "q")] == numbers[("reward", "alpha")] == "NUMBER"
    assert numbers[("retrieve", "k1")] == "INTEGER" and numbers[("retrieve", "lam")] == "FLOAT"
    unknown = _invoke("help", "nope")
    assert unknown.exit_code == 1 and unknown.stderr.startswith("memrl: error: no command 'nope'; the commands are ")


def test_the_command_list_writes_descriptions_out() -> None:
    """`memrl --help` at 80 columns: each command's first sentence whole (wrapped), never cut with "..."."""
    text = _invoke("--help").stdout
    listing = text.partition("\nCommands:\n")[2]
    assert "..." not in listing, listing
    for name, command in _commands().items():
        if command.hidden:  # an alias (`receipts`), not listed
            continue
        first = " ".join(command.help.split()).split(". ")[0].rstrip(".")
        assert first in " ".join(listing.split()), (name, first, listing)


def test_real_memrl_h_and_help(tmp_path: Path) -> None:
    """The installed entry point too: -h, `memrl help COMMAND`."""
    assert run_memrl("retrieve", "-h").stdout == run_memrl("help", "retrieve").stdout
    assert "Examples:\n  memrl retrieve" in run_memrl("retrieve", "-h").stdout


def test_json_is_the_only_switch_to_json(tmp_path: Path) -> None:
    """Without --json every command prints text for people (doctor and calibrate too), with it exactly one JSON
    object (in this process, for speed). Every command with --json is run here, or in `not_here` with where it is."""
    db = tmp_path / "b.db"
    v = json.dumps([1.0, 0.0, 0.0, 0.0])
    memrl(db, "ingest", "--intent", "heat an egg", "--experience", "microwave", "--vector", v,
          "--embedder", "external:t:4")
    memrl(db, "export", "--vectors", "-o", str(tmp_path / "in.jsonl"))
    runs = {
        "ingest": ["--intent", "boil an egg", "--experience", "pot", "--vector", v],
        "retrieve": ["heat an egg", "--vector", v],
        "reward": ["--memory", "1", "--reward", "success"],
        "quarantine": ["1"], "release": ["1"], "reset-q": ["1"],
        "undo": ["--source", "nobody", "--dry-run"],
        "inspect": [], "explain": ["1"], "calibrate": [], "doctor": [],
        "export": ["-o", str(tmp_path / "out.jsonl")],
        "import": [str(tmp_path / "in.jsonl")],
        "backup": [str(tmp_path / "copy{}.db")],
    }
    runs |= {"memories": [], "log": [], "receipts": [], "config": [], "history": ["1"]}
    not_here = {"bench": "tests/test_harness.py", "report": "tests/test_report.py",
                "merge": "test_export_import_merge_backup_calibrate_doctor",
                "forget": "tests/test_cli_everyday.py", "edit": "tests/test_cli_everyday.py"}
    with_json = {name for name, c in _commands().items() if any("--json" in p.opts for p in c.params)}
    assert with_json <= set(runs) | set(not_here), f"run these with and without --json here: {with_json - set(runs)}"
    for name, args in runs.items():
        for as_json_flag in (False, True):
            filled = [a.format(int(as_json_flag)) for a in args]
            done = _invoke(name, *filled, "--db", str(db), *(["--json"] if as_json_flag else []))
            assert done.exit_code == 0, (name, done.output)
            out = done.stdout if name != "export" else done.stdout + done.stderr
            if as_json_flag:
                assert isinstance(as_json(done), dict), (name, out)
            else:
                assert out.strip() and not out.lstrip().startswith(("{", "[")), f"memrl {name} printed JSON:\n{out}"
    doctor = _invoke("doctor", "--db", str(db)).stdout
    assert "ok: no problems found" in doctor and "engine" in doctor
    assert _invoke("calibrate", "--db", str(db)).stdout.startswith("z(sim) uses: mean ")


def test_mcp_and_proxy_share_host_and_port_and_ports_differ() -> None:
    """`--host`/`--port` on both servers, `mcp --http` hidden (deprecated); the default ports of the proxy,
    MCP over HTTP and the offline model all differ."""
    from memrl_bench.framework.local_llm import DEFAULT_PORT as MODEL_PORT

    from memrl_cli.cli import MCP_PORT

    commands = _commands()
    for name in ("mcp", "proxy"):
        options = {o for p in commands[name].params if not p.hidden for o in p.opts}
        assert {"--host", "--port"} <= options and "--http" not in options, (name, options)
    proxy_port = next(p.default for p in commands["proxy"].params if p.name == "port")
    assert len({proxy_port, MCP_PORT, MODEL_PORT}) == 3, (proxy_port, MCP_PORT, MODEL_PORT)
    both = error_line(run_memrl("mcp", "--http", "127.0.0.1:0", "--port", "1", ok=False))
    assert "give --host/--port, not --http" in both


def test_export_piped_into_ingest_points_to_import(tmp_path: Path) -> None:
    """`memrl export | memrl ingest --jsonl -`: one line naming `memrl import`, and the bank unchanged. The export
    (larger than a pipe's buffer) loses its reader early: it stops quietly, adding no line of its own."""
    import sys

    from conftest import cli_env

    db = tmp_path / "b.db"
    with MemoryBank(db, "external:t:4") as made:
        made.ingest_many([{"intent": f"task {i}", "experience": "x" * 2000, "vector": [1.0, float(i), 0.0, 0.0]}
                          for i in range(300)])
    before = table_state(str(db))
    memrl_cmd = f"'{sys.executable}' -m memrl_cli"
    piped = subprocess.run(f"{memrl_cmd} export --db '{db}' | {memrl_cmd} ingest --jsonl - --db '{db}'", shell=True,
                           capture_output=True, text=True, env=cli_env(), timeout=120)
    assert "load it with `memrl import FILE` (or `memrl export | memrl import -`)" in error_line(piped)
    assert table_state(str(db)) == before
