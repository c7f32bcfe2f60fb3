"""Bad input to every command: one line on stderr starting "memrl: error:", a non-zero exit, and
the bank exactly as it was (a checksum of every table's rows, or of the file's bytes when it is
not a readable database).

Each case runs `python -m memrl_cli` in a subprocess on its own copy of a small bank (embedder
`external:bad:8`: memories 1-3, receipt 1 rewarded, receipt 2 not). The cases run concurrently
in one module fixture; each test checks one case's result.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import typer.main

from conftest import cli_env, error_line
from memrl_cli.bank import MemoryBank
from memrl_cli.cli import app, type_name
from memrl_cli.method.retrieval import RetrieveParams

DIM = 8
V = json.dumps([0.5, 0.1, -0.2, 0.3, 0.0, 0.7, -0.1, 0.2])
NAN_V = V.replace("0.5", "NaN", 1)
INF_V = V.replace("0.5", "Infinity", 1)
ZERO_V = json.dumps([0.0] * DIM)
TOY = "benchmarks.testing.toy_benchmark:Passcodes"
DEAD_URL = "http://127.0.0.1:9/v1"

Prepare = Callable[[Path, Path], list[str]]  # (case dir, bank) -> argv after `memrl`


@dataclass
class Case:
    """One bad input: the argv (built by `prepare`, which may also damage the bank) and the expected error."""

    name: str
    prepare: Prepare
    expect: str
    stdin: bytes | None = None
    root: bool = False  # needs root (mounts, chattr)
    wrap: list[str] = field(default_factory=list)  # a command prefix (prlimit)
    cleanup: Callable[[Path], None] | None = None


def fill(arg: str, d: Path, db: Path) -> str:
    return arg.replace("{db}", str(db)).replace("{dir}", str(d))


def args(*argv: str) -> Prepare:
    """A case whose argv is fixed; "{db}" and "{dir}" are filled in."""
    return lambda d, db: [fill(a, d, db) for a in argv]


def with_file(name: str, content: bytes | str, *argv: str) -> Prepare:
    """Write `content` to DIR/name first."""
    def prepare(d: Path, db: Path) -> list[str]:
        data = content.encode() if isinstance(content, str) else content
        (d / name).write_bytes(data)
        return [fill(a, d, db) for a in argv]
    return prepare


def jsonl(*objects: object) -> str:
    return "".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objects)


def memory(i: int, **extra: object) -> dict:
    return {"intent": f"new task {i}", "experience": f"new experience {i}", "vector": json.loads(V), **extra}


def damaged(damage: Callable[[Path], None], *argv: str) -> Prepare:
    """Damage the bank file, then run argv."""
    def prepare(d: Path, db: Path) -> list[str]:
        damage(db)
        return [fill(a, d, db) for a in argv]
    return prepare


def truncate(db: Path) -> None:
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 3])


def corrupt_header(db: Path) -> None:
    data = bytearray(db.read_bytes())
    data[:16] = b"NOT A DATABASE!\x00"
    db.write_bytes(bytes(data))


def corrupt_pages(db: Path) -> None:
    data = bytearray(db.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    for start in range(page, len(data), page):  # every b-tree page but the schema's
        data[start:start + 64] = b"\xa5" * 64
    db.write_bytes(bytes(data))


def damage_page(table: str) -> Callable[[Path], None]:
    """Overwrite the root page of `table` (in this small bank, all its rows) with garbage: a bank with a damaged page."""
    def damage(db: Path) -> None:
        with sqlite3.connect(db) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            page = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
        conn.close()
        data = bytearray(db.read_bytes())
        size = int.from_bytes(data[16:18], "big")
        data[(page - 1) * size:page * size] = b"\xa5" * size
        db.write_bytes(bytes(data))
    return damage


def sql(*statements: str) -> Callable[[Path], None]:
    def run(db: Path) -> None:
        with sqlite3.connect(db) as conn:
            for s in statements:
                conn.execute(s)
        conn.close()
    return run


def other_embedder_bank(d: Path, db: Path) -> list[str]:
    with MemoryBank(d / "other.db", "external:other:8") as other:
        other.ingest("other task", "other experience", vector=json.loads(V))
    return ["merge", str(db), str(d / "other.db"), "--output", str(d / "merged.db")]


def immutable(d: Path, db: Path) -> list[str]:
    subprocess.run(["chattr", "+i", str(db)], check=True)
    return ["ingest", "--intent", "a", "--experience", "b", "--vector", V, "--db", str(db)]


def read_only_mount(d: Path, db: Path) -> list[str]:
    view = d / "ro"
    view.mkdir()
    subprocess.run(["mount", "--bind", str(d), str(view)], check=True)
    subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], check=True)
    return ["reward", "--memory", "1", "--reward", "1", "--db", str(view / db.name)]


def full_disk(d: Path, db: Path) -> list[str]:
    disk = d / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], check=True)
    shutil.copy(db, disk / db.name)
    with open(disk / "filler", "wb", buffering=0) as f:  # fill the disk, then leave ~16 KB
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    os.truncate(disk / "filler", os.path.getsize(disk / "filler") - 16384)
    big = {"intent": "fill the disk", "experience": "y" * 400_000, "vector": json.loads(V)}
    (d / "big.jsonl").write_text(json.dumps(big) + "\n")
    return ["ingest", "--jsonl", str(d / "big.jsonl"), "--db", str(disk / db.name)]


def unmount(*names: str) -> Callable[[Path], None]:
    def run(d: Path) -> None:
        for name in names:
            if os.path.ismount(d / name):
                subprocess.run(["umount", str(d / name)], check=True)
    return run


def unfreeze(d: Path) -> None:
    subprocess.run(["chattr", "-i", str(d / "bank.db")], check=False)


BIG_TEXT = "z" * (10 * 1024 * 1024)
EXPORT_HEADER = {"memrl_export": 1, "schema": 2, "embedder": {"spec": "external:bad:8", "dim": 8}}

CASES = [
    # ingest
    Case("ingest vector of the wrong dimension", args("ingest", "--intent", "a", "--experience", "b", "--vector",
                                                      "[1, 2, 3]"), "dimension 3"),
    Case("ingest NaN vector", args("ingest", "--intent", "a", "--experience", "b", "--vector", NAN_V), "nan"),
    Case("ingest infinite vector", args("ingest", "--intent", "a", "--experience", "b", "--vector", INF_V), "infinite"),
    Case("ingest zero vector", args("ingest", "--intent", "a", "--experience", "b", "--vector", ZERO_V), "zero length"),
    Case("ingest vector that is a string", args("ingest", "--intent", "a", "--experience", "b", "--vector", '"abc"'),
         "list of numbers"),
    Case("ingest vector that is not JSON", args("ingest", "--intent", "a", "--experience", "b", "--vector", "[1, 2"),
         "must be json"),
    Case("ingest NaN q", args("ingest", "--intent", "a", "--experience", "b", "--vector", V, "--q", "nan"), "finite"),
    Case("ingest non-numeric q", args("ingest", "--intent", "a", "--experience", "b", "--vector", V, "--q", "high"),
         "must be a number"),
    Case("ingest empty intent", args("ingest", "--intent", "", "--experience", "b", "--vector", V), "non-empty"),
    Case("ingest blank experience", args("ingest", "--intent", "a", "--experience", "   ", "--vector", V), "non-empty"),
    Case("ingest unknown outcome", args("ingest", "--intent", "a", "--experience", "b", "--vector", V, "--outcome",
                                        "won"), "outcome"),
    Case("ingest metadata that is not JSON", args("ingest", "--intent", "a", "--experience", "b", "--vector", V,
                                                  "--metadata", "{x"), "--metadata must be json"),
    Case("ingest metadata that is a list", args("ingest", "--intent", "a", "--experience", "b", "--vector", V,
                                                "--metadata", "[1]"), "metadata must be a json object"),
    Case("ingest without experience", args("ingest", "--intent", "a"), "give --intent and --experience"),
    Case("ingest without a vector on an external-embedder bank", args("ingest", "--intent", "a", "--experience", "b"),
         "pass a vector"),
    Case("ingest with another embedder", args("ingest", "--intent", "a", "--experience", "b", "--vector", V,
                                              "--embedder", "external:other:8"), "made with embedder"),
    Case("ingest 10 MB text", with_file("big.jsonl", jsonl(memory(1, experience=BIG_TEXT)), "ingest", "--jsonl",
                                        "{dir}/big.jsonl"), "longer than"),
    Case("ingest NUL in text", with_file("nul.jsonl", jsonl(memory(1, intent="a\u0000b")), "ingest", "--jsonl",
                                         "{dir}/nul.jsonl"), "nul byte"),
    Case("ingest lone surrogate", with_file("sur.jsonl", '{"intent": "a\\ud800", "experience": "b", "vector": '
                                            + V + "}\n", "ingest", "--jsonl", "{dir}/sur.jsonl"), "utf-8"),
    Case("ingest invalid UTF-8 line", with_file("bad.jsonl", jsonl(memory(1)).encode() + b'{"intent": "\xff\xfe"}\n',
                                                "ingest", "--jsonl", "{dir}/bad.jsonl"), "line 2: not valid utf-8"),
    Case("ingest binary file", with_file("bin.jsonl", bytes(range(256)) * 64, "ingest", "--jsonl", "{dir}/bin.jsonl"),
         "line 1"),
    Case("ingest broken JSONL line in the middle", args("ingest", "--jsonl", "-"), "line 2: invalid json",
         stdin=(jsonl(memory(1)) + '{"intent": "x", "experience": \n' + jsonl(memory(3))).encode()),
    Case("ingest non-object line", args("ingest", "--jsonl", "-"), "line 2: expected a json object",
         stdin=jsonl(memory(1), [1, 2], memory(3)).encode()),
    Case("ingest unknown field", args("ingest", "--jsonl", "-"), "unknown field",
         stdin=jsonl(memory(1, colour="red")).encode()),
    Case("ingest wrong dimension in the middle of a stream", args("ingest", "--jsonl", "-"), "dimension 3",
         stdin=jsonl(memory(1), memory(2, vector=[1, 2, 3]), memory(3)).encode()),
    Case("ingest a memrl export file", args("ingest", "--jsonl", "-"), "load it with `memrl import FILE`",
         stdin=jsonl(EXPORT_HEADER, memory(1)).encode()),
    Case("ingest missing JSONL file", args("ingest", "--jsonl", "{dir}/nope.jsonl"), "cannot read"),
    # retrieve
    Case("retrieve vector of the wrong dimension", args("retrieve", "q", "--vector", "[1, 2]"), "dimension 2"),
    Case("retrieve NaN vector", args("retrieve", "q", "--vector", NAN_V), "nan"),
    Case("retrieve without a vector on an external-embedder bank", args("retrieve", "q"), "pass a vector"),
    Case("retrieve empty query", args("retrieve", "", "--vector", V), "non-empty"),
    Case("retrieve k1 = 0", args("retrieve", "q", "--vector", V, "--k1", "0"), "positive"),
    Case("retrieve threshold 2", args("retrieve", "q", "--vector", V, "--threshold", "2"), "threshold"),
    Case("retrieve NaN lambda", args("retrieve", "q", "--vector", V, "--lambda", "nan"), "lambda"),
    Case("retrieve non-numeric k1", args("retrieve", "q", "--vector", V, "--k1", "many"), "k1"),
    Case("retrieve from a missing bank", args("retrieve", "q", "--vector", V, "--db", "{dir}/missing.db"), "no bank"),
    # reward
    Case("config unknown setting", args("config", "temperature", "1"), "unknown setting 'temperature'"),
    Case("config reversed reward range", args("config", "reward_range", "5", "1"), "min < max"),
    Case("edit unknown memory", args("edit", "999", "--experience", "x"), "unknown memory id 999"),
    Case("forget unknown memory", args("forget", "999"), "unknown memory id 999"),
    Case("history unknown memory", args("history", "999"), "unknown memory id 999"),
    Case("log count 0", args("log", "-n", "0"), "count must be an integer"),
    Case("receipts count 0", args("receipts", "-n", "0"), "count must be an integer"),
    Case("memories non-numeric q", args("memories", "--q-min", "high"), "--q-min must be a number"),
    Case("memories unknown outcome", args("memories", "--outcome", "maybe"), "outcome must be one of"),
    Case("reward NaN", args("reward", "--memory", "1", "--reward", "nan"), "finite"),
    Case("reward inf", args("reward", "--memory", "1", "--reward", "inf"), "finite"),
    Case("reward non-numeric", args("reward", "--memory", "1", "--reward", "yes"),
         "finite number (1 for success, -1 for failure, or a value in between) or the word success or failure"),
    Case("reward without a value", args("reward", "--memory", "1"), "give --reward"),
    Case("reward unknown memory", args("reward", "--memory", "999", "--reward", "1"), "unknown memory id 999"),
    Case("reward unknown receipt", args("reward", "--retrieval", "999", "--reward", "1"), "unknown retrieval id 999"),
    Case("reward a receipt twice", args("reward", "--retrieval", "1", "--reward", "1"), "already rewarded"),
    Case("reward alpha 0", args("reward", "--memory", "1", "--reward", "1", "--alpha", "0"), "alpha"),
    Case("reward receipt and memory ids", args("reward", "--retrieval", "2", "--memory", "1", "--reward", "1"),
         "give one of --retrieval, --task, --last, --memory and --jsonl"),
    Case("reward broken JSONL line in the middle", args("reward", "--jsonl", "-"), "line 2",
         stdin=b'{"memory_ids": [1], "reward": 1}\n{"memory_ids": [2], \n{"memory_ids": [3], "reward": 1}\n'),
    Case("reward unknown memory at the end of a stream", args("reward", "--jsonl", "-"), "unknown memory id 999",
         stdin=jsonl({"memory_ids": [1], "reward": 1}, {"retrieval_id": 2, "reward": -1},
                     {"memory_ids": [999], "reward": 1}).encode()),
    Case("reward NaN in a stream", args("reward", "--jsonl", "-"), "finite",
         stdin=b'{"memory_ids": [1], "reward": 1}\n{"memory_ids": [2], "reward": NaN}\n'),
    # inspect, explain, calibrate
    Case("inspect unknown memory", args("inspect", "--memory", "999"), "unknown memory id 999"),
    Case("explain unknown receipt", args("explain", "999"), "unknown retrieval id 999"),
    Case("inspect two modes", args("inspect", "--stats", "--verify"), "choose one"),
    Case("calibrate mean without std", args("calibrate", "--mean", "0.2"), "give both"),
    Case("calibrate negative std", args("calibrate", "--mean", "0.2", "--std", "-1"), "std > 0"),
    # hygiene and health: a known id next to an unknown one changes nothing either
    Case("quarantine an unknown id", args("quarantine", "1", "999"), "unknown memory id 999"),
    Case("release an unknown id", args("release", "1", "999"), "unknown memory id 999"),
    Case("reset-q an unknown id", args("reset-q", "1", "999"), "unknown memory id 999"),
    Case("undo without a filter", args("undo"), "give --source, --since and/or --until"),
    Case("undo since a bad time", args("undo", "--since", "yesterday"), "must be an ISO 8601 time"),
    Case("doctor with an unknown index", args("doctor", "--index", "bogus"), "index must be"),
    # export, import, merge, backup, bench
    Case("export into a missing directory", args("export", "--output", "{dir}/no/such/dir/out.jsonl"), "cannot write"),
    Case("import broken line in the middle", args("import", "-"), "line 3: invalid json",
         stdin=(jsonl(EXPORT_HEADER, memory(1)) + "{oops\n" + jsonl(memory(2))).encode()),
    Case("import a newer export format", args("import", "-"), "export format 99",
         stdin=jsonl({**EXPORT_HEADER, "memrl_export": 99}, memory(1)).encode()),
    Case("import a broken ledger", args("import", "-"), "ledger",
         stdin=jsonl(EXPORT_HEADER, memory(1, ledger=[{"kind": "reward", "q_before": 0}])).encode()),
    Case("import a missing file", args("import", "{dir}/nope.jsonl"), "cannot read"),
    Case("merge into an existing file", args("merge", "{db}", "{db}", "--output", "{db}"), "exists"),
    Case("merge with a missing bank", args("merge", "{db}", "{dir}/missing.db", "--output", "{dir}/m.db"), "no bank"),
    Case("merge banks of different embedders", other_embedder_bank, "different embedders"),
    Case("backup onto an existing file", args("backup", "{db}"), "exists"),
    Case("backup into a missing directory", args("backup", "{dir}/no/such/dir/b.db"), "cannot"),
    Case("bench with zero epochs", args("bench", TOY, "--epochs", "0", "--base-url", DEAD_URL, "--runs-dir", "{dir}"),
         "epochs must be a whole number of at least 1"),
    Case("bench resume of a missing run", args("bench", TOY, "--resume", "{dir}/no-run", "--base-url", DEAD_URL),
         "run directory"),
    # damaged or foreign bank files
    Case("truncated bank", damaged(truncate, "inspect", "--stats"), "not a valid memrl bank"),
    Case("truncated bank, ingest", damaged(truncate, "ingest", "--intent", "a", "--experience", "b", "--vector", V),
         "not a valid memrl bank"),
    Case("corrupt header", damaged(corrupt_header, "reward", "--memory", "1", "--reward", "1"),
         "not a memrl bank: not a SQLite database"),
    Case("corrupt pages", damaged(corrupt_pages, "ingest", "--intent", "a", "--experience", "b", "--vector", V),
         "not a valid memrl bank"),
    Case("retrieve from a bank with a damaged page", damaged(damage_page("memories"), "retrieve", "q", "--vector", V),
         "is damaged, not a valid memrl bank (database disk image is malformed)"),
    Case("inspect the top Q of a bank with a damaged page", damaged(damage_page("memories"), "inspect", "--top-q", "3"),
         "is damaged, not a valid memrl bank (database disk image is malformed)"),
    Case("inspect the stats of a bank with a damaged page", damaged(damage_page("memories"), "inspect"),
         "is damaged, not a valid memrl bank (database disk image is malformed)"),
    Case("backup of a bank with a damaged page", damaged(damage_page("rewards"), "backup", "{dir}/copy.db"),
         "is damaged, not a valid memrl bank"),
    Case("a text file as the bank", lambda d, db: (db.write_text("hello\n" * 100), ["inspect", "--stats"])[1],
         "not a memrl bank: not a SQLite database"),
    Case("a directory as the bank", args("inspect", "--stats", "--db", "{dir}"), "directory"),
    Case("a newer schema version", damaged(sql("PRAGMA user_version = 99"), "ingest", "--intent", "a", "--experience",
                                           "b", "--vector", V), "newer"),
    Case("a bank recorded with the local embedder at 8 dimensions",
         damaged(sql("""UPDATE meta SET value = '{"spec": "local", "dim": 8, "normalized": true, "probe": null}'
                        WHERE key = 'embedder'"""), "retrieve", "heat an apple"), "made with embedder"),
    Case("a read-only (immutable) file", immutable, "read-only", root=True, cleanup=unfreeze),
    Case("a read-only file system", read_only_mount, "read-only", root=True, cleanup=unmount("ro")),
    Case("a full disk", full_disk, "is the disk full", root=True, cleanup=unmount("disk")),
    Case("a file size limit (RLIMIT_FSIZE)",
         with_file("big.jsonl", jsonl(memory(1, experience="w" * 300_000)), "ingest", "--jsonl", "{dir}/big.jsonl"),
         "cannot write", wrap=["prlimit", "--fsize=65536"]),
]


def make_template(path: Path) -> None:
    """The bank every case starts from."""
    with MemoryBank(path, f"external:bad:{DIM}") as bank:
        vectors = [[1.0 if j == i else 0.1 for j in range(DIM)] for i in range(3)]
        bank.ingest_many([{"intent": f"task {i}", "experience": f"did {i}", "vector": v}
                          for i, v in enumerate(vectors)])
        first = bank.retrieve("task 0", RetrieveParams(k1=3, k2=2, threshold=-1), vector=vectors[0])
        bank.reward(1.0, retrieval_id=first.id)
        bank.retrieve("task 1", RetrieveParams(k1=3, k2=2, threshold=-1), vector=vectors[1])


def checksum(db: Path) -> str:
    """Every table's rows and the schema version (or the raw bytes if SQLite cannot read the file)."""
    if not db.exists():
        return "absent"
    if db.is_dir():
        return "directory"
    digest = hashlib.sha256()
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            digest.update(str(conn.execute("PRAGMA user_version").fetchone()).encode())
            tables = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY name").fetchall()
            for name, ddl in tables:
                digest.update(f"{name}\0{ddl}".encode())
                if not (ddl or "").upper().startswith("CREATE VIRTUAL TABLE"):
                    rows = conn.execute(f'SELECT * FROM "{name}"').fetchall()
                    digest.update(repr(sorted(rows, key=repr)).encode())
        finally:
            conn.close()
        return "rows:" + digest.hexdigest()
    except sqlite3.DatabaseError:
        return "bytes:" + hashlib.sha256(db.read_bytes()).hexdigest()


@dataclass
class Outcome:
    returncode: int
    stderr: str
    before: str
    after: str


def run_case(case: Case, d: Path, template: Path) -> Outcome:
    d.mkdir()
    db = d / "bank.db"
    shutil.copy(template, db)
    try:
        argv = case.prepare(d, db)
        if "--db" not in argv and argv[0] != "merge":
            argv += ["--db", str(db)]
        target = Path(argv[argv.index("--db") + 1]) if "--db" in argv else db
        before = checksum(target)
        done = subprocess.run([*case.wrap, sys.executable, "-m", "memrl_cli", *argv], input=case.stdin or b"",
                              capture_output=True, env=cli_env(), timeout=180)  # bytes: stdin may be any
        return Outcome(done.returncode, done.stderr.decode(errors="replace"), before, checksum(target))
    finally:
        if case.cleanup:
            case.cleanup(d)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Outcome]]:
    base = tmp_path_factory.mktemp("bad_input")
    template = base / "template.db"
    make_template(template)
    runnable = [c for c in CASES if not c.root or os.geteuid() == 0]
    with ThreadPoolExecutor(4) as pool:
        results = dict(zip([c.name for c in runnable], pool.map(
            lambda ic: run_case(ic[1], base / f"case{ic[0]}", template), enumerate(runnable))))
    yield results


def test_every_bank_command_has_a_case() -> None:
    """Every command that takes `--db` is fed bad input here (the servers `mcp` and `proxy` in their own
    tests); a case's name starts with its command. Names are unique (they are the test ids)."""
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    with_db = {name for name, command in commands.items() if any("--db" in p.opts for p in command.params)}
    uncovered = with_db - {"mcp", "proxy"} - {c.name.split()[0] for c in CASES}
    assert not uncovered, f"no bad-input case for: {sorted(uncovered)}"
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.slow
def test_bad_input_is_one_line_error_and_changes_nothing(case: Case, outcomes: dict[str, Outcome]) -> None:
    if case.name not in outcomes:
        pytest.skip("needs root (mount, chattr)")
    result = outcomes[case.name]
    line = error_line(result)
    assert case.expect.lower() in line.lower(), line
    assert result.after == result.before


# -- every command, fed a bank file that is not a bank --------------------------------------------------------
# Each registered command (iterated from the Typer app, so a new one is covered as it lands) is pointed at a
# damaged bank, an empty file, another program's SQLite database and a file that is not SQLite, and must
# refuse it in one line naming the problem, writing nothing: not to the file, nor a file next to it.

NO_BANK = {"help"}  # the commands that open no bank


def foreign_sqlite(db: Path) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO accounts VALUES (1, 'x')")
    conn.close()


BAD_BANKS: dict[str, tuple[Callable[[Path, Path], None], str]] = {  # (make it from the template, expected text)
    # one damaged page, the meta table's, which every command reads when it opens a bank
    "damaged": (lambda template, db: (shutil.copy(template, db), damage_page("meta")(db)) and None,
                "is damaged, not a valid memrl bank (database disk image is malformed)"),
    "empty file": (lambda template, db: db.write_bytes(b""), "is an empty file, not a memrl bank"),
    "foreign SQLite": (lambda template, db: foreign_sqlite(db), "is not a memrl bank (it has tables but no memrl"),
    "not SQLite": (lambda template, db: db.write_text("name,q\nfirst,0.5\n"), "not a memrl bank: not a SQLite database"),
}


def bank_argv(name: str, command: typer.core.TyperCommand, bad: Path, d: Path) -> list[str]:
    """An argv that gets `memrl NAME` as far as opening the bank `bad`: the arguments a command checks before
    (SPECIAL), else a placeholder for each required parameter, by its type, and `--db bad`."""
    special: dict[str, list[str]] = {
        "ingest": ["--intent", "a", "--experience", "b", "--vector", V],
        "reward": ["--memory", "1", "--reward", "1"],
        "undo": ["--source", "x"],
        "import": [str(d / "in.jsonl")],
        "backup": [str(d / "copy.db")],
        "export": ["--output", str(d / "out.jsonl")],
        "bench": [TOY, "--base-url", DEAD_URL, "--runs-dir", str(d / "runs")],
        "proxy": ["--upstream", DEAD_URL, "--port", "0"],
        "merge": [str(bad), str(bad), "--output", str(d / "merged.db")],
        "report": [str(d / "run")],
    }
    (d / "in.jsonl").write_text(jsonl(memory(1)))
    (d / "run").mkdir()
    (d / "run" / "config.json").write_text(json.dumps({"run_id": "r1", "bank": str(bad)}))
    if name in special:
        argv = special[name]
    else:
        placeholder = {"INTEGER": "1", "FLOAT": "0.5", "TEXT": "x"}
        argv = [value for p in command.params if p.required
                for value in ([] if p.param_type_name == "argument" else [p.opts[0]]) + [placeholder[type_name(p)]]]
    with_db = any("--db" in p.opts for p in command.params)
    return [name, *argv, *(["--db", str(bad)] if with_db and "--db" not in argv else [])]


def bank_commands() -> dict[str, typer.core.TyperCommand]:
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    return {name: c for name, c in commands.items() if name not in NO_BANK}


@pytest.mark.parametrize("kind", sorted(BAD_BANKS))
def test_every_command_refuses_a_bad_bank_in_one_line_and_writes_nothing(kind: str, tmp_path: Path) -> None:
    """In this process (CliRunner: the commands' own code, as `memrl` runs it, quickly); the subprocess cases above
    (those of a bank with a damaged page among them) run the real entry point."""
    from typer.testing import CliRunner

    for name, command in bank_commands().items():  # a new command takes a bank, or is named in NO_BANK
        assert any("--db" in p.opts for p in command.params) or name in ("merge", "report"), \
            f"`memrl {name}` takes no --db: add it to NO_BANK, or teach bank_argv how it opens a bank"
    template = tmp_path / "template.db"
    make_template(template)
    make, expect = BAD_BANKS[kind]
    for i, (name, command) in enumerate(sorted(bank_commands().items())):
        d = tmp_path / f"case{i}"
        d.mkdir()
        bad = d / "bank.db"
        make(template, bad)
        argv = bank_argv(name, command, bad, d)
        files, data = sorted(os.listdir(d)), bad.read_bytes()
        outputs = []
        for as_json in ([], ["--json"]) if any("--json" in p.opts for p in command.params) else ([],):
            result = CliRunner().invoke(app, [*argv, *as_json], prog_name="memrl", env={"MEMRL_DB": None})
            assert result.exception is None or isinstance(result.exception, SystemExit), (argv, result.exception)
            # `bench` names its bank first (docs/bench.md); the one line after it is the error
            stderr = "".join(x for x in result.stderr.splitlines(True) if not x.startswith("memrl: bank: "))
            outputs.append((result.exit_code, stderr, result.stdout))
        code, stderr, _ = outputs[0]
        line = error_line(subprocess.CompletedProcess(argv, code, "", stderr))
        assert expect in line and str(bad) in line, (argv, line)
        if len(outputs) == 2:  # --json: the same error as one JSON object on stdout, nothing on stderr
            assert outputs[1][0] == code and outputs[1][1] == "", (argv, outputs[1])
            assert json.loads(outputs[1][2])["error"]["message"] == line.removeprefix("memrl: error: "), argv
        assert bad.read_bytes() == data, f"memrl {name} wrote to a {kind} file"
        assert sorted(os.listdir(d)) == files, f"memrl {name} left files next to a {kind} file: {os.listdir(d)}"


def test_a_second_process_on_a_running_run_stops_in_one_line(tmp_path: Path) -> None:
    """Two resumes of one run at once: the second finds the run directory's lock held (here by this process,
    as the first resume would hold it) and stops naming it, before touching the bank or the run."""
    from memrl_bench.framework.harness import run_lock

    run = tmp_path / "run"
    run.mkdir()
    make_template(tmp_path / "bank.db")
    (run / "config.json").write_text(json.dumps({"run_id": "r1", "bank": str(tmp_path / "bank.db"),
                                                 "config": {"benchmark": TOY}}))
    before = checksum(tmp_path / "bank.db")
    held = run_lock(run, "r1")
    try:
        done = subprocess.run([sys.executable, "-m", "memrl_cli", "bench", TOY, "--resume", str(run), "--base-url",
                               DEAD_URL], capture_output=True, text=True, env=cli_env(), timeout=180)
    finally:
        os.close(held)
    done.stderr = "".join(x for x in done.stderr.splitlines(True) if not x.startswith("memrl: bank: "))
    line = error_line(done)
    assert f"run r1 is already running in another process (pid {os.getpid()})" in line, line
    assert f"--resume {run}" in line and checksum(tmp_path / "bank.db") == before
    assert sorted(os.listdir(run)) == ["config.json", "run.lock"]


def test_a_constraint_race_is_one_line_that_says_to_run_again(tmp_path: Path) -> None:
    """Two processes recording the same row at once (here: the same run twice, as two racing starts of one run
    would): the loser's UNIQUE violation is a one-line MemrlError saying what happened, and nothing is written."""
    from memrl_cli.ops import runs
    from memrl_cli.errors import MemrlError

    db = tmp_path / "bank.db"
    make_template(db)
    with MemoryBank(db) as bank:
        runs.create_run(bank, "r1", "toy", "memrl", {}, {}, 0, "test")
        before = checksum(db)
        with pytest.raises(MemrlError) as raised:
            runs.create_run(bank, "r1", "toy", "memrl", {}, {}, 0, "test")
    message = str(raised.value)
    assert message.startswith(f"another process wrote the same rows to {db} at the same time (UNIQUE constraint "
                              "failed: runs.id); nothing was changed: run the command again"), message
    assert "\n" not in message and checksum(db) == before
