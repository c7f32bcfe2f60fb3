"""Banks from elsewhere: opening a crafted .db never runs what it carries. memrl refuses it with a
one-line error, or ignores the foreign part and says so on stderr; never a traceback. Also:
API keys never reach the bank, the run directory or the logs."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks.testing.chat_server import ScriptedChatServer
from conftest import error_line, run_memrl
from benchmarks.testing.toy_benchmark import responder

from memrl_cli.store import sqlite as memrl_sqlite
from memrl_cli.bank import MemoryBank
from memrl_cli.errors import MemrlError

DIM = 8
V = [0.5, 0.1, -0.2, 0.3, 0.0, 0.7, -0.1, 0.2]
TESTS = Path(__file__).parent


def make_bank(path: Path) -> None:
    with MemoryBank(path, f"external:untrusted:{DIM}") as bank:
        bank.ingest_many([{"intent": f"task {i}", "experience": f"did {i}",
                           "vector": [1.0 if j == i else 0.1 for j in range(DIM)]} for i in range(3)])
        bank.set_index("vec")  # the optional sqlite-vec index: crafted files may alter it too


def craft(path: Path, *statements: str, vec: bool = False) -> None:
    """Alter the bank with raw SQL (with sqlite-vec loaded when `vec`)."""
    conn = memrl_sqlite.connect(str(path)) if vec else sqlite3.connect(path, isolation_level=None)
    if vec:
        assert memrl_sqlite.load_vec(conn).loaded
    for s in statements:
        conn.execute(s)
    conn.close()


def memrl(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_memrl(*args, "--db", str(db), ok=False)


PWNED = "CREATE TABLE pwned (at TEXT)"
META_EMBEDDER = "UPDATE meta SET value = '{}' WHERE key = 'embedder'"

REFUSED: list[tuple[str, list[str], str]] = [
    ("trigger on insert", [PWNED, "CREATE TRIGGER t AFTER INSERT ON memories BEGIN INSERT INTO pwned VALUES "
                                  "(datetime()); END"], "triggers memrl did not create (t)"),
    ("trigger on update", [PWNED, "CREATE TRIGGER upd BEFORE UPDATE ON memories BEGIN INSERT INTO pwned VALUES "
                                  "('x'); END"], "triggers memrl did not create (upd)"),
    ("trigger with a huge name", [PWNED, f"CREATE TRIGGER {'t' * 100_000} AFTER INSERT ON meta BEGIN "
                                         "INSERT INTO pwned VALUES ('x'); END"], "triggers memrl did not create"),
    ("extra index on an expression", ["CREATE INDEX evil ON memories (length(experience) * 2)"],
     "an index memrl did not create ('evil')"),
    ("memrl table defined differently", [
        "ALTER TABLE memories RENAME TO old_memories", "CREATE TABLE memories (id INTEGER PRIMARY KEY, intent TEXT)"],
     "is not defined as memrl defines it"),
    ("a constraint calling load_extension", [
        "ALTER TABLE memories RENAME TO old_memories",
        "CREATE TABLE memories (id INTEGER PRIMARY KEY, intent TEXT CHECK (load_extension('/nonexistent/evil') IS NULL))"],
     "unsafe use of load_extension()"),
    ("meta embedder not JSON", [META_EMBEDDER.replace("'{}'", "'{{{not json'")], "'embedder' is not JSON"),
    ("meta embedder a JSON list", [META_EMBEDDER.replace("'{}'", "'[1, 2]'")], "is not a JSON object"),
    ("meta embedder absurd dimension", [META_EMBEDDER.replace(
        "'{}'", """'{"spec": "external:untrusted:8", "dim": 1000000000000, "probe": null}'""")], "impossible dimension"),
    ("meta embedder negative dimension", [META_EMBEDDER.replace(
        "'{}'", """'{"spec": "external:untrusted:8", "dim": -8}'""")], "impossible dimension"),
    ("meta embedder dimension as text", [META_EMBEDDER.replace(
        "'{}'", """'{"spec": "external:untrusted:8", "dim": "eight"}'""")], "impossible dimension"),
    ("meta embedder huge spec", [META_EMBEDDER.replace(
        "'{}'", """'{"spec": "external:""" + "x" * 2_000_000 + """:8", "dim": 8}'""")], "is not a short JSON text"),
    ("meta similarity statistics broken", ["""INSERT OR REPLACE INTO meta VALUES ('sim_stats', '{"mean": "high"}')"""],
     "'sim_stats' has no finite mean"),
    ("meta override with zero std", ["""INSERT OR REPLACE INTO meta VALUES ('sim_stats_override',
        '{"mean": 0.1, "std": 0}')"""], "positive std"),
    ("meta reward range upside down", ["""INSERT OR REPLACE INTO meta VALUES ('reward_range',
        '{"min": 5, "max": -5}')"""], "'reward_range' has no finite min below its max"),
    ("meta index state unknown", ["""UPDATE meta SET value = '{"state": "evil"}' WHERE key = 'index'"""],
     "unknown index state"),
    ("negative schema version", ["PRAGMA user_version = -1"], "not a memrl bank"),
]


@pytest.mark.parametrize("name, statements, expect", REFUSED, ids=[c[0] for c in REFUSED])
def test_crafted_bank_is_refused(tmp_path: Path, name: str, statements: list[str], expect: str) -> None:
    db = tmp_path / "crafted.db"
    make_bank(db)
    craft(db, *statements)
    before = db.read_bytes()
    line = error_line(memrl(db, "ingest", "--intent", "new", "--experience", "x", "--vector", json.dumps(V)))
    assert expect in line and len(line) < 1000, line
    with pytest.raises(MemrlError):
        MemoryBank(db)
    assert db.read_bytes() == before  # nothing written, nothing fired
    if "pwned" in " ".join(statements):
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT count(*) FROM pwned").fetchone()[0] == 0


def test_a_foreign_sqlite_database_is_not_turned_into_a_bank(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    craft(db, "CREATE TABLE accounts (id INTEGER PRIMARY KEY, name TEXT)", "INSERT INTO accounts VALUES (1, 'x')")
    before = db.read_bytes()
    line = error_line(memrl(db, "inspect", "--stats"))
    assert "not a memrl bank" in line and len(line) < 1000, line
    assert db.read_bytes() == before


IGNORED: list[tuple[str, list[str], str]] = [
    ("view calling load_extension", ["CREATE VIEW evil AS SELECT load_extension('/nonexistent/evil.so') AS x"],
     "ignoring view 'evil'"),
    ("extra table", ["CREATE TABLE notes (x)", "INSERT INTO notes VALUES ('keep me')"], "ignoring table 'notes'"),
    ("unknown meta key with a huge value", [f"INSERT INTO meta VALUES ('junk', '{'j' * 3_000_000}')"], ""),
]


@pytest.mark.parametrize("name, statements, warning", IGNORED, ids=[c[0] for c in IGNORED])
def test_foreign_objects_are_ignored_and_reported(tmp_path: Path, name: str, statements: list[str],
                                                  warning: str) -> None:
    db = tmp_path / "crafted.db"
    make_bank(db)
    craft(db, *statements)
    done = memrl(db, "retrieve", "task 0", "--vector", json.dumps([1.0] + [0.1] * (DIM - 1)), "--threshold", "-1",
                 "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["memories"][0]["intent"] == "task 0"
    if warning:
        assert done.stderr.startswith(f"memrl: warning: {warning}") and "Traceback" not in done.stderr
    if name == "extra table":
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT x FROM notes").fetchall() == [("keep me",)]


@pytest.mark.parametrize("definition", [
    "vec0(memory_id INTEGER PRIMARY KEY, embedding float[4] distance_metric=cosine)",  # another dimension
    "vec0(memory_id INTEGER PRIMARY KEY, embedding float[8] distance_metric=l2)",  # another metric
    None,  # a plain table in its place
])
def test_a_vec0_index_that_differs_is_rebuilt_from_the_raw_vectors(tmp_path: Path, definition: str | None) -> None:
    db = tmp_path / "crafted.db"
    make_bank(db)
    create = f"CREATE VIRTUAL TABLE memory_index USING {definition}" if definition else \
        "CREATE TABLE memory_index (memory_id INTEGER PRIMARY KEY, embedding BLOB)"
    craft(db, "DROP TABLE memory_index", create, vec=True)
    query = json.dumps([0.1, 1.0] + [0.1] * (DIM - 2))
    done = memrl(db, "retrieve", "task 1", "--vector", query, "--threshold", "-1", "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "memrl: warning: ignoring the sqlite-vec index: it is not defined as memrl " \
                                  "defines it; rebuilt it from the stored vectors"
    found = json.loads(done.stdout)["memories"]
    assert found[0]["intent"] == "task 1" and 0 < found[0]["similarity"] <= 1.0
    again = memrl(db, "inspect", "--verify", "--json")
    assert again.returncode == 0 and again.stderr == "" and json.loads(again.stdout)["ok"]


# -- secrets ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_api_key_never_reaches_bank_run_outputs_or_logs(tmp_path: Path) -> None:
    key = "sk-planted-" + os.urandom(12).hex()
    env = {k: v for k, v in os.environ.items() if k not in ("MEMRL_DB", "OPENAI_BASE_URL")}
    env.update(OPENAI_API_KEY=key, PYTHONPATH=os.pathsep.join([str(TESTS.parent), env.get("PYTHONPATH", "")]))
    with ScriptedChatServer(responder) as server:
        done = subprocess.run([sys.executable, "-m", "memrl_cli", "bench", "benchmarks.testing.toy_benchmark:Passcodes", "--epochs", "2",
                               "--batch-size", "2", "--threshold", "0.3", "--option", "rooms=3", "--workers", "1",
                               "--eval", "val", "--runs-dir", str(tmp_path / "runs"), "--base-url", server.base_url,
                               "--model", "scripted"], env=env, capture_output=True, text=True, timeout=300)
        sent = [json.dumps(r) for r in server.requests]
    assert done.returncode == 0, done.stderr
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "bank.db" for p in files) and any(p.name == "config.json" for p in files)
    for path in files:
        data = path.read_bytes()
        assert key.encode() not in data, path
        assert key.encode("utf-16-le") not in data, path
    assert key not in done.stdout and key not in done.stderr
    assert sent and not any(key in body for body in sent)  # not even echoed into prompts
    with MemoryBank(next(tmp_path.rglob("bank.db")), create=False) as bank:
        dump = "\n".join(bank.conn.iterdump()) if hasattr(bank.conn, "iterdump") else ""
        assert key not in dump
