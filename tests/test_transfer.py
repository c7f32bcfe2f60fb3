"""Moving memories: JSONL export/import round trips, merging banks, and online backup.

Tests that take `bank_at` run on SQLite and on PostgreSQL (tests/conftest.py); backup and the
merge's staging files are SQLite's own. Moves between engines are in tests/test_postgres.py.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from memrl_cli.bank import MemoryBank
from memrl_cli.errors import MemrlError
from memrl_cli.ops.inspection import memory as memory_view
from memrl_cli.ops.inspection import verify
from memrl_cli.method.retrieval import RetrieveParams
from memrl_cli.ops.transfer import backup, export_jsonl, import_jsonl, merge, parse_ingest_lines, read_export

INTENTS = ["heat an apple in the microwave", "cool a tomato in the fridge", "wash a plate in the sink",
           "put two pillows on the sofa", "examine the book under the lamp", "slice bread with a knife"]
FIELDS = ("intent", "experience", "outcome", "task_id", "source", "metadata", "q", "q_init", "visits",
          "created_at", "updated_at", "last_used_at")
LEDGER = ("kind", "reward", "alpha", "q_floor", "q_before", "q_after", "created_at", "source")


def learned_bank(location: str, intents: list[str] = INTENTS, rewards: int = 3) -> None:
    """A local-embedder bank with memories, receipts, rewards (some floored) and a `set` row."""
    with MemoryBank(location) as bank:
        bank.ingest_many([{"intent": t, "experience": f"steps for {t}", "outcome": "success" if i % 2 else "failure",
                           "task_id": f"t{i}", "metadata": {"n": i}} for i, t in enumerate(intents)])
        for r in range(rewards):
            hit = bank.retrieve(intents[r % len(intents)], RetrieveParams(k1=4, k2=2, threshold=-1.0))
            bank.reward(1.0 if r % 2 else -1.0, retrieval_id=hit.id, floor=-0.5)
        bank.set_q(1, 0.42, "manual")


def snapshot(location: str) -> dict[str, dict]:
    """Every memory (by intent) with its fields, float32 vector and ledger."""
    with MemoryBank(location) as bank:
        out = {}
        for (mid,) in bank.conn.execute("SELECT id FROM memories").fetchall():
            row = memory_view(bank, mid)
            blob = bank.conn.execute("SELECT embedding FROM memories WHERE id = ?", (mid,)).fetchone()[0]
            out[row["intent"]] = {**{k: row[k] for k in FIELDS}, "vector": bank.store.decode([blob])[0],
                                  "ledger": [{k: r[k] for k in LEDGER} for r in row["ledger"]]}
        return out


@pytest.mark.parametrize("vectors", [True, False])
def test_export_import_round_trip(bank_at: Callable[[str], str], vectors: bool) -> None:
    learned_bank(bank_at("a"))
    buffer = io.StringIO()
    with MemoryBank(bank_at("a")) as bank:
        assert export_jsonl(bank, buffer, vectors=vectors) == len(INTENTS)
    lines = buffer.getvalue().splitlines()
    header = json.loads(lines[0])
    assert header["memrl_export"] == 1 and header["embedder"]["spec"] == "local" and header["vectors"] is vectors
    assert ("vector" in json.loads(lines[1])) is vectors
    with MemoryBank(bank_at("b")) as copy:
        counts = import_jsonl(copy, io.BytesIO(buffer.getvalue().encode()))
        assert counts == {"created": len(INTENTS), "duplicates": 0, "merged": 0}
        assert verify(copy)["ok"]
        again = import_jsonl(copy, io.BytesIO(buffer.getvalue().encode()))
        assert again == {"created": 0, "duplicates": len(INTENTS), "merged": 0}
    before, after = snapshot(bank_at("a")), snapshot(bank_at("b"))
    assert before.keys() == after.keys()
    assert sum(len(m["ledger"]) for m in before.values()) >= 7
    for intent, mem in before.items():
        got = after[intent]
        assert {k: got[k] for k in FIELDS} == {k: mem[k] for k in FIELDS}
        assert got["ledger"] == mem["ledger"]
        if vectors:
            assert np.array_equal(got["vector"], mem["vector"])
        else:  # re-embedded by the same deterministic embedder
            assert float(got["vector"] @ mem["vector"]) > 0.9999


def test_import_from_another_embedder_re_embeds(bank_at: Callable[[str], str]) -> None:
    rng = np.random.default_rng(0)
    with MemoryBank(bank_at("ext"), "external:mine:16") as bank:
        for t in INTENTS[:3]:
            bank.ingest(t, "x", vector=rng.normal(size=16).tolist())
        bank.reward(1.0, memory_ids=[2])
        buffer = io.StringIO()
        export_jsonl(bank, buffer, vectors=True)
    with MemoryBank(bank_at("local")) as local:
        assert import_jsonl(local, io.BytesIO(buffer.getvalue().encode()))["created"] == 3
        assert local.dim == 384 and verify(local)["ok"]
        hit = local.retrieve("warm an apple using the microwave", RetrieveParams(k2=1, lam=0.0, threshold=0.0),
                             record=False)  # by similarity alone: the re-embedded intents are what is tested
        assert hit.memories[0]["intent"] == INTENTS[0]
        assert memory_view(local, 2)["q"] == pytest.approx(0.3)


def test_import_with_a_bad_line_writes_nothing(bank_at: Callable[[str], str]) -> None:
    good = [json.dumps({"intent": t, "experience": "x"}) for t in INTENTS[:4]]
    with MemoryBank(bank_at("b")) as bank:
        for bad, message in (("{not json", "line 3: invalid JSON"),
                             (json.dumps({"intent": "a"}), "line 3: experience must be a non-empty string"),
                             (json.dumps({"intent": "a", "experience": "b", "visits": -1}),
                              "line 3: visits must be a non-negative integer")):
            data = "\n".join(good[:2] + [bad] + good[2:]) + "\n"
            with pytest.raises(MemrlError, match=message):
                import_jsonl(bank, io.BytesIO(data.encode()))
            with pytest.raises(MemrlError, match=message.split(":")[0]):
                parse_ingest_lines(io.BytesIO(data.encode()))
        assert bank.count() == 0
        with pytest.raises(MemrlError, match="line 1: export format 9 is not supported"):
            import_jsonl(bank, io.BytesIO(b'{"memrl_export": 9}\n'))


def test_merge_reconciles_duplicates_and_keeps_both_ledgers(bank_at: Callable[[str], str]) -> None:
    a, b, c = bank_at("a"), bank_at("b"), bank_at("c")
    learned_bank(a, INTENTS[:4], rewards=3)
    learned_bank(b, INTENTS[2:], rewards=4)
    before_a, before_b = snapshot(a), snapshot(b)
    counts = merge(a, b, c)
    assert counts == {"created": 2, "duplicates": 0, "merged": 2}
    merged = snapshot(c)
    assert sorted(merged) == sorted(INTENTS)
    with MemoryBank(c) as bank:
        assert verify(bank)["ok"]
    for intent in INTENTS[2:4]:  # in both banks
        x, y, m = before_a[intent], before_b[intent], merged[intent]
        assert m["visits"] == x["visits"] + y["visits"]
        total = x["visits"] + y["visits"]
        expected = (x["q"] * x["visits"] + y["q"] * y["visits"]) / total if total else (x["q"] + y["q"]) / 2
        assert m["q"] == pytest.approx(expected, abs=1e-12)
        assert m["ledger"][:len(x["ledger"])] == x["ledger"]
        carried = [r for r in m["ledger"][len(x["ledger"]):] if not (r["source"] or "").startswith("merge:")]
        assert carried == y["ledger"]
        assert m["ledger"][-1]["kind"] == "set" and m["ledger"][-1]["q_after"] == m["q"]
    for intent in INTENTS[:2]:
        assert merged[intent]["ledger"] == before_a[intent]["ledger"]
    for intent in INTENTS[4:]:
        assert merged[intent]["ledger"] == before_b[intent]["ledger"]
        assert merged[intent]["q"] == before_b[intent]["q"]
    with pytest.raises(MemrlError, match="merge writes a new bank"):  # SQLite: the file exists; PostgreSQL: not empty
        merge(a, b, c)


def test_merge_refuses_different_embedders(bank_at: Callable[[str], str]) -> None:
    learned_bank(bank_at("a"), INTENTS[:2], rewards=0)
    with MemoryBank(bank_at("b"), "external:x:8") as bank:
        bank.ingest("a", "b", vector=[1.0] * 8)
    with pytest.raises(MemrlError, match="cannot merge banks made with different embedders"):
        merge(bank_at("a"), bank_at("b"), bank_at("c"))
    with pytest.raises(MemrlError, match="no (memrl )?bank"):  # the output was not even created
        MemoryBank(bank_at("c"), create=False)


WRITER = """
import sys, numpy as np
from memrl_cli.bank import MemoryBank
bank = MemoryBank(sys.argv[1])
rng = np.random.default_rng(1)
for i in range(400):
    bank.reward(float(rng.uniform(-1, 1)), memory_ids=[1 + i % 5])
    if i % 10 == 0:
        bank.ingest(f"new {i}", "x", vector=rng.normal(size=8).tolist())
"""


def test_backup_while_another_process_writes(tmp_path: Path) -> None:
    path = tmp_path / "live.db"
    with MemoryBank(path, "external:t:8") as bank:
        bank.ingest_many([{"intent": f"m{i}", "experience": "x", "vector": [float(i == j) + 0.1 for j in range(8)]}
                          for i in range(5)])
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stderr=subprocess.PIPE, text=True)
    copies: list[Path] = []
    try:
        with MemoryBank(path) as bank:
            deadline = time.monotonic() + 60
            while writer.poll() is None and time.monotonic() < deadline and len(copies) < 8:
                copies.append(tmp_path / f"copy{len(copies)}.db")
                assert backup(bank, str(copies[-1])) > 0
                time.sleep(0.05)
            with pytest.raises(MemrlError, match="exists; pass --force"):
                backup(bank, str(copies[0]))
    finally:
        _, err = writer.communicate(timeout=120)
    assert writer.returncode == 0, err
    assert len(copies) >= 2
    rewards_seen = []
    for copy in copies:
        with MemoryBank(copy) as bank:
            report = verify(bank)
            assert report["ok"], report
            rewards_seen.append(report["ledger_rows"])
    assert rewards_seen == sorted(rewards_seen)
    with MemoryBank(path) as bank:
        assert verify(bank)["ledger_rows"] == 400


REWARDER = """
import os, sys
from memrl_cli.bank import MemoryBank
bank, stop, i = MemoryBank(sys.argv[1]), sys.argv[2], 0
while not os.path.exists(stop):
    bank.reward(1.0 if i % 2 else -1.0, memory_ids=[1 + i % 5])
    i += 1
    if i == 1:
        print("writing", flush=True)
"""


@pytest.mark.slow
def test_export_and_verify_while_another_process_rewards(bank_at: Callable[[str], str], tmp_path: Path) -> None:
    """Each export (and each verify) reads one state of the bank: its Q values replay its ledgers."""
    path = bank_at("live")
    with MemoryBank(path, "external:t:4") as bank:
        bank.ingest_many([{"intent": f"m{i}", "experience": "x", "vector": [1.0, i, 0.0, 1.0]} for i in range(5)])
    stop = tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", REWARDER, path, str(stop)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "writing\n", writer.communicate()
        with MemoryBank(path) as bank:
            for _ in range(50):
                buffer = io.StringIO()
                export_jsonl(bank, buffer)
                read_export(io.BytesIO(buffer.getvalue().encode()))  # raises if a Q is not its ledger's replay
                report = verify(bank)
                assert report["ok"], report["problems"]
    finally:
        stop.touch()
        _, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err


def test_import_refuses_a_ledger_that_does_not_replay_to_q(bank_at: Callable[[str], str]) -> None:
    line = {"intent": "heat an egg", "experience": "SCRIPT: microwave", "q": 0.9, "q_init": 0.0,
            "ledger": [{"kind": "reward", "reward": 1.0, "alpha": 0.3, "q_floor": None, "q_before": 0.0, "q_after": 0.3}]}
    with MemoryBank(bank_at("bank"), "external:test:3") as bank:
        with pytest.raises(MemrlError, match="line 1: q is not the replay"):
            import_jsonl(bank, io.BytesIO(json.dumps(line).encode()))
        line["q"] = 0.3
        line["vector"] = [1.0, 0.0, 0.0]
        header = {"memrl_export": 1, "embedder": {"spec": "external:test:3", "dim": 3}}
        data = "\n".join(json.dumps(x) for x in (header, line)).encode()
        assert import_jsonl(bank, io.BytesIO(data))["created"] == 1
        assert verify(bank)["ok"]


def test_a_failed_merge_leaves_no_output(tmp_path: Path) -> None:
    with MemoryBank(tmp_path / "a.db", "external:a:3") as a:
        a.ingest("x", "y", vector=[1.0, 0.0, 0.0])
    with MemoryBank(tmp_path / "b.db", "external:b:3") as b:
        b.ingest("x", "y", vector=[1.0, 0.0, 0.0])
    with pytest.raises(MemrlError, match="different embedders"):
        merge(str(tmp_path / "a.db"), str(tmp_path / "b.db"), str(tmp_path / "c.db"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.db", "b.db"]
