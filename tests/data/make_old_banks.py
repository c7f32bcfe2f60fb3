"""Write the banks of tests/test_old_banks.py: a bank made by memrl at commit 9ce9eef (before the
harness's tables left the core migrations), on SQLite (`bank_9ce9eef.db`) and on PostgreSQL
(`bank_9ce9eef.pg.sql`, a `pg_dump` of it), and what they must answer (`bank_9ce9eef.json`).

Run once, with the code of that commit: `python tests/data/make_old_banks.py ADMIN_DSN` (a PostgreSQL
server with pgvector, e.g. `benchmarks.testing.pg_server.LocalPostgres().dsn`). Uses only the public API.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from memrl_cli.ops import hygiene  # noqa: E402
from memrl_cli.ops import runs  # noqa: E402
from memrl_cli.bank import MemoryBank  # noqa: E402
from memrl_cli.method.retrieval import RetrieveParams  # noqa: E402

VECTORS = [[1.0, 0.0, 0.0, 0.0], [0.9, 0.1, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.7, 0.0, 0.7, 0.0],
           [0.0, 0.0, 0.0, 1.0]]
QUERY = [1.0, 0.05, 0.1, 0.0]
PARAMS = RetrieveParams(k1=5, k2=3, threshold=-1.0)


def fill(location: str) -> dict:
    """Memories, a receipt, rewards, a quarantine and a run with one committed batch; what a retrieve answers."""
    with MemoryBank(location, "external:test:4") as bank:
        for n, vector in enumerate(VECTORS):
            bank.ingest(f"task {n}", f"do step {n}", "success" if n % 2 else "failure", task_id=f"t{n}",
                        source=f"agent-{n % 2}", vector=vector)
        first = bank.retrieve("first", PARAMS, vector=QUERY)
        bank.reward(1.0, retrieval_id=first.id, source="agent-0")
        bank.reward(-0.5, memory_ids=[3], alpha=0.5, source="agent-1")
        hygiene.quarantine(bank, [5], reason="spam", actor="tester")
        runs.create_run(bank, "run-1", "toy", "memrl", {"epochs": 1}, {"llm": "none"}, 0, "9ce9eef")
        runs.record_batch(bank, "run-1", "train", "train", 0, 0, [
            {"phase": "train", "split": "train", "epoch": 0, "batch": 0, "position": 0, "task_id": "t0",
             "success": True, "reward": 1.0, "steps": 2, "status": "ok", "env_error": False,
             "retrieval_id": first.id, "memory_ids": [m["id"] for m in first.memories], "new_memory_id": None,
             "usage": {}}])
        runs.set_status(bank, "run-1", "finished")
        answer = bank.retrieve("again", PARAMS, vector=QUERY, record=False)
        return {"retrieved": [m["id"] for m in answer.memories],
                "q": {str(m["id"]): m["q"] for m in answer.memories}}


def main() -> None:
    sqlite_bank = HERE / "bank_9ce9eef.db"
    sqlite_bank.unlink(missing_ok=True)
    expected = fill(str(sqlite_bank))
    from benchmarks.testing.pg_server import find_binaries, temporary_database

    with temporary_database(sys.argv[1], "memrl_fixture") as url:
        assert fill(url) == expected
        dump = subprocess.run([str(find_binaries() / "pg_dump"), "--no-owner", "--no-privileges", "--inserts", url], check=True,
                              capture_output=True, text=True).stdout
    lines = [line for line in dump.splitlines() if not line.startswith("\\")]  # psql meta-commands
    (HERE / "bank_9ce9eef.pg.sql").write_text("\n".join(lines) + "\n")
    (HERE / "bank_9ce9eef.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main()
