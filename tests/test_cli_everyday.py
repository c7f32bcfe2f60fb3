"""The everyday commands as real subprocesses, on both engines: `memories` in its four formats, `log`
(and its hidden alias `receipts`), `reward --last`, `forget`, `edit`, `history`, and `--scope` on
ingest and retrieve; one-line errors and one JSON object with `--json`."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable

import pytest

from conftest import error_line, run_memrl
from served import learned_state

E = "[1, 0, 0, 0]"
NEAR = "[0.95, 0.3, 0, 0]"


def memrl(db: str, *args: str, ok: bool = True) -> str:
    done = run_memrl(*args, "--db", db, ok=ok)
    return done.stdout if ok else error_line(done)


def one_json(text: str) -> dict:
    lines = text.splitlines()
    assert len(lines) == 1, text
    return json.loads(lines[0])


@pytest.mark.slow  # ~45 s per engine on 2 busy cores: 40 commands, each a process
def test_scope_memories_log_reward_last_forget_edit_history(bank_at: Callable[[str], str]) -> None:
    db = bank_at("cli")
    for intent, experience, scope, vector in (("heat an egg", "microwave", "user:alice", E),
                                              ("heat an egg", "microwave", "user:bob", E),
                                              ("warm a mug", "stove, 50% power", None, NEAR)):
        memrl(db, "ingest", "--intent", intent, "--experience", experience, "--vector", vector,
              "--embedder", "external:test:4", *(["--scope", scope] if scope else []))
    found = one_json(memrl(db, "retrieve", "eggs", "--vector", E, "--threshold", "-1", "--scope", "user:a*", "--json"))
    assert [m["id"] for m in found["memories"]] == [1]

    listed = one_json(memrl(db, "memories", "--json"))["memories"]
    assert [(m["id"], m["scope"]) for m in listed] == [(3, None), (2, "user:bob"), (1, "user:alice")]
    rows = list(csv.DictReader(io.StringIO(memrl(db, "memories", "--csv", "--scope", "user:*", "--order", "oldest"))))
    assert [(r["id"], r["scope"], r["experience"]) for r in rows] == [("1", "user:alice", "microwave"),
                                                                      ("2", "user:bob", "microwave")]
    lines = memrl(db, "memories", "--nl", "--text", "50%").splitlines()
    assert [json.loads(line)["id"] for line in lines] == [3]
    table = memrl(db, "memories", "--q-max", "0.5", "--limit", "2")
    assert "2 memories" in table and "user:bob" in table
    assert "choose one of --table, --csv, --nl, --json" in memrl(db, "memories", "--csv", "--nl", ok=False)
    assert "--q-min must be a number" in memrl(db, "memories", "--q-min", "high", ok=False)

    second = one_json(memrl(db, "retrieve", "warm it", "--vector", NEAR, "--threshold", "-1", "--json"))["retrieval_id"]
    log = one_json(memrl(db, "log", "-n", "5", "--json"))["receipts"]
    assert [(r["id"], r["query"], r["rewarded"]) for r in log] == [(second, "warm it", False), (1, "eggs", False)]
    assert one_json(memrl(db, "receipts", "--unrewarded", "--json")) == one_json(memrl(db, "log", "--json"))
    done = one_json(memrl(db, "reward", "--last", "--reward", "1", "--json"))
    assert done["retrieval_id"] == second and done["updated"] and done["query"] == "warm it"
    assert f'rewarded retrieval {second} ("warm it")' in memrl(db, "reward", "--last", "--reward", "1",
                                                               "--allow-repeat")
    before = learned_state(db)
    assert f"the newest receipt is retrieval {second} (\"warm it\"): it was already rewarded" in \
        memrl(db, "reward", "--last", "--reward", "1", ok=False)  # never the older one, 1, in its place
    assert learned_state(db) == before
    assert "give one of --retrieval, --task, --last, --memory and --jsonl, not --retrieval and --last" in memrl(
        db, "reward", "--last", "--retrieval", "1", "--reward", "1", ok=False)
    assert " yes " in memrl(db, "log")

    assert one_json(memrl(db, "forget", "2", "--json")) == {"forgotten": [2], "unchanged": [], "erased": [2],
                                                            "vacuumed": False}
    assert "already forgotten: [2]" in memrl(db, "forget", "2")
    edited = one_json(memrl(db, "edit", "1", "--experience", "microwave, 30 s", "--json"))
    assert edited == {"id": 4, "replaces": 1, "reembedded": False}
    history = one_json(memrl(db, "history", "4", "--json"))
    assert [v["id"] for v in history["versions"]] == [1, 4] and history["current"] == 4
    assert "replaced by 4" in memrl(db, "history", "1")
    assert [m["id"] for m in one_json(memrl(db, "memories", "--forgotten", "--json"))["memories"]] == [2, 1]
    found = one_json(memrl(db, "retrieve", "eggs", "--vector", E, "--threshold", "-1", "--json", "--no-record"))
    assert sorted(m["id"] for m in found["memories"]) == [3, 4]
    assert one_json(memrl(db, "inspect", "--verify", "--json"))["ok"]
    assert "unknown memory id 9" in memrl(db, "edit", "9", "--outcome", "success", ok=False)
    assert "unknown memory id 9" in memrl(db, "history", "9", ok=False)
    assert "scope 'user:*' contains a pattern character" in memrl(
        db, "ingest", "--intent", "a", "--experience", "b", "--vector", E, "--scope", "user:*", ok=False)
    error = one_json(run_memrl("forget", "9", "--db", db, "--json", ok=False).stdout)
    assert "unknown memory id 9" in error["error"]["message"]


def test_receipts_is_a_hidden_alias_of_log() -> None:
    listing = run_memrl("--help").stdout
    commands = [line.split()[0] for line in listing.split("Commands:")[1].splitlines()
                if line.startswith("  ") and line[2] != " "]  # a command's line, not a wrapped help's
    assert "log" in commands and "receipts" not in commands
    assert "--unrewarded" in run_memrl("receipts", "--help").stdout  # the same options as log
    assert run_memrl("help").stdout == listing + "\n" or run_memrl("help").stdout == listing
    unknown = error_line(run_memrl("help", "recipts", ok=False))
    assert "no command 'recipts'; the commands are ingest, retrieve" in unknown and "receipts" not in unknown
    assert "log" in unknown


def on_a_terminal(*args: str) -> tuple[bytes, bytes]:
    """Run `memrl ARGS` with stderr on a pseudo-terminal: (stdout, what the terminal showed)."""
    import os
    import pty
    import subprocess
    import sys

    from conftest import cli_env

    leader, follower = pty.openpty()
    done = subprocess.run([sys.executable, "-m", "memrl_cli", *args], stderr=follower, stdout=subprocess.PIPE,
                          env=cli_env(COLUMNS="80", TERM="xterm"), timeout=120)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    assert done.returncode == 0, shown
    return done.stdout, shown


def test_bulk_ingest_and_import_show_progress_on_a_terminal_only(tmp_path) -> None:
    source = tmp_path / "m.jsonl"
    source.write_text("".join(json.dumps({"intent": f"task {i % 3}", "experience": f"try {i}"}) + "\n"
                              for i in range(30)))  # the local embedder: three texts to embed
    for command, said in ((["ingest", "--jsonl", str(source)], b"ingested 30 memories"),
                          (["import", str(source)], b"imported 30 memories")):
        out, shown = on_a_terminal(*command, "--db", str(tmp_path / f"{command[0]}.db"))
        assert said in out and b"embedding" in shown  # the progress bar, drawn on the terminal
        piped = run_memrl(*command, "--db", str(tmp_path / f"{command[0]}-piped.db"))
        assert said.decode() in piped.stdout and piped.stderr == ""  # not a terminal: no bar


def test_tables_fit_80_columns_without_breaking_words(tmp_path) -> None:
    """`memrl log` and `inspect --top-q` at 80 columns: no line wider, every header and every word of 12 characters
    or less whole (times as `2026-01-31 12:00:00`, a word each); `memories --text ""` lists as without --text;
    `ingest --q 7` is refused outside the reward range, writing nothing."""
    db = str(tmp_path / "b.db")
    for intent, experience in (("heat an egg in the microwave, then put it on the table", "SCRIPT: microwave 30 s"),
                               ("water the plants", "SCRIPT: a can, each pot")):
        memrl(db, "ingest", "--intent", intent, "--experience", experience, "--vector", E, "--embedder",
              "external:test:4")
    before = learned_state(db)
    assert "q 7 is outside the bank's reward range [-1, 1]" in memrl(
        db, "ingest", "--intent", "x", "--experience", "y", "--vector", E, "--q", "7", ok=False)
    assert learned_state(db) == before
    memrl(db, "quarantine", "2", "--reason", "check")
    memrl(db, "retrieve", "heat an egg in the microwave, then put it on the table", "--vector", E, "--task",
          "ticket-4711")
    listed = one_json(memrl(db, "memories", "--text", "", "--json"))
    assert listed == one_json(memrl(db, "memories", "--json")) and len(listed["memories"]) == 2
    env = {"COLUMNS": "80"}
    for args, headers in ((("log",), ["id", "created", "task", "memories", "rewarded", "reward", "query"]),
                          (("inspect", "--top-q", "5"), ["id", "q", "visits", "outcome", "quarantined_at", "intent",
                                                         "experience"])):
        out = run_memrl(*args, "--db", db, env=env).stdout
        assert max(map(len, out.splitlines())) <= 80, out
        words = set(out.split())
        assert set(headers) <= words, out
        stamp = one_json(memrl(db, *args, "--json"))
        times = [v for row in stamp.get("receipts", stamp.get("memories", [])) for k, v in row.items()
                 if (k in headers or k == "created_at" and "created" in headers) and k.endswith("_at") and v]
        assert times, stamp
        for value in times:
            day, clock = value[:10], value[11:19]
            assert day in words and clock in words, (value, out)
        assert {"ticket-4711", "microwave,", "SCRIPT:"} & words, out
