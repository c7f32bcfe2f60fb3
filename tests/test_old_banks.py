"""Banks made before the Store owned the engine and the harness owned its tables open, verify and answer
unchanged on both engines; a bank no run has used carries no run tables, and `report`/`inspect` on it
answer clearly. The old banks are fixtures made by memrl at commit 9ce9eef (tests/data/make_old_banks.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import error_line
from memrl_cli.ops import inspection, memories
from memrl_cli.ops import runs
from memrl_cli.store import migrations as schema
from memrl_cli.bank import MemoryBank
from memrl_cli.errors import MemrlError
from memrl_cli.method.retrieval import RetrieveParams

DATA = Path(__file__).resolve().parent / "data"
EXPECTED = json.loads((DATA / "bank_9ce9eef.json").read_text())
QUERY = [1.0, 0.05, 0.1, 0.0]
PARAMS = RetrieveParams(k1=5, k2=3, threshold=-1.0)


def old_sqlite_bank(tmp_path: Path) -> str:
    path = tmp_path / "old.db"
    shutil.copyfile(DATA / "bank_9ce9eef.db", path)
    return str(path)


def old_postgres_bank(url: str) -> str:
    """Restore the dump of the old PostgreSQL bank into the fresh database `url` (it sets its own
    search_path, so on a connection of its own)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute((DATA / "bank_9ce9eef.pg.sql").read_text())
    return url


def check_old_bank(location: str) -> None:
    """Opens, verifies, retrieves the same ids with the same Q, keeps its run, and takes a new one."""
    with MemoryBank(location, create=False) as bank:
        report = inspection.verify(bank)
        assert report["ok"], report["problems"]
        assert report["memories"] == 5 and report["ledger_rows"] == 4
        answer = bank.retrieve("again", PARAMS, vector=QUERY, record=False)
        assert [m["id"] for m in answer.memories] == EXPECTED["retrieved"]
        assert {str(m["id"]): m["q"] for m in answer.memories} == EXPECTED["q"]
        assert 5 in bank.quarantined()
        assert bank.store.migrated_to(schema.RUNS) == 1  # adopted: core migration 2 made these tables
        assert bank.meta(schema.RUNS.meta_key or "") is None  # nothing written by opening it
        assert runs.get_run(bank, "run-1")["status"] == "finished"
        assert runs.completed_batches(bank, "run-1") == {("train", "train", 0, 0)}
        assert [e["task_id"] for e in runs.episodes(bank, "run-1")] == ["t0"]
        assert bank.store.schema_version() == schema.LATEST and bank.store.has_table("tasks")  # migrated to 7
        assert all(r["task_id"] is None and r["scope"] is None for r in memories.receipts(bank, 100))
        tagged = bank.retrieve("again", PARAMS, vector=QUERY, task_id="t-old", scope="user:old")
        assert bank.task_receipt("t-old") == tagged.id and memories.receipts(bank, 1)[0]["task_id"] == "t-old"
        runs.create_run(bank, "run-2", "toy", "memrl", {}, {}, 1, "now")
        assert bank.meta(schema.RUNS.meta_key or "") == schema.RUNS.latest
        bank.reward(1.0, memory_ids=[2])
        assert inspection.verify(bank)["ok"]


def test_an_old_sqlite_bank_opens_verifies_and_answers_unchanged(tmp_path: Path) -> None:
    check_old_bank(old_sqlite_bank(tmp_path))
    again = tmp_path / "again"
    again.mkdir()
    location = old_sqlite_bank(again)
    with pytest.raises(MemrlError, match=f"not a memrl bank at schema {schema.LATEST}; open it writable to migrate"):
        MemoryBank(location, readonly=True)  # a read-only open cannot add the newer columns (scope, forget)
    MemoryBank(location, create=False).close()  # a writable open migrates it
    with MemoryBank(location, readonly=True) as bank:  # then read-only too
        assert inspection.verify(bank)["ok"]
        assert runs.get_run(bank, "run-1")["status"] == "finished"


@pytest.mark.postgres
def test_an_old_postgres_bank_opens_verifies_and_answers_unchanged(pg_dsn: str) -> None:
    check_old_bank(old_postgres_bank(pg_dsn))


def test_a_bank_no_run_used_has_no_run_tables(bank_at) -> None:
    location = bank_at("b")
    with MemoryBank(location, "external:test:4") as bank:
        bank.ingest("heat an egg", "microwave", "success", vector=[1.0, 0.0, 0.0, 0.0])
        assert not any(bank.store.has_table(t) for t in schema.RUNS.tables)
        assert not runs.has_runs(bank) and not runs.has_run(bank, "r") and runs.episodes(bank, "r") == []
        assert runs.completed_batches(bank, "r") == set()
        with pytest.raises(Exception, match="no run 'r' in .* \\(no benchmark run has used this bank\\)"):
            runs.get_run(bank, "r")
        assert inspection.verify(bank)["ok"]
        runs.create_run(bank, "r", "toy", "memrl", {}, {}, 0, "test")  # the harness creates its tables
        assert all(bank.store.has_table(t) for t in schema.RUNS.tables)
        assert runs.get_run(bank, "r")["status"] == "running"
        runs.create_run(bank, "r2", "toy", "memrl", {}, {}, 0, "test")  # already at the latest: nothing to do
    with MemoryBank(location, create=False) as bank:
        assert inspection.verify(bank)["ok"] and bank.meta(schema.RUNS.meta_key or "") == 1


def test_report_and_inspect_on_a_bank_without_run_tables(tmp_path: Path) -> None:
    db = tmp_path / "b.db"
    with MemoryBank(str(db), "external:test:4") as bank:
        bank.ingest("heat an egg", "microwave", "success", vector=[1.0, 0.0, 0.0, 0.0])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"run_id": "r1", "bank": str(db)}))
    memrl = [sys.executable, "-m", "memrl_cli"]
    done = subprocess.run(memrl + ["report", str(run_dir)], capture_output=True, text=True, timeout=120)
    assert error_line(done) == f"memrl: error: no run 'r1' in {db} (no benchmark run has used this bank)"
    done = subprocess.run(memrl + ["inspect", "--verify", "--db", str(db), "--json"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and json.loads(done.stdout)["ok"] is True, done.stderr


def test_a_newer_run_schema_is_refused(tmp_path: Path) -> None:
    with MemoryBank(str(tmp_path / "b.db"), "external:test:4") as bank:
        runs.create_run(bank, "r", "toy", "memrl", {}, {}, 0, "test")
        with bank.transaction():
            bank.store.set_meta(schema.RUNS.meta_key or "", schema.RUNS.latest + 1)
        with pytest.raises(Exception, match="runs tables have schema version 2, newer than this memrl"):
            runs.create_run(bank, "r2", "toy", "memrl", {}, {}, 0, "test")
