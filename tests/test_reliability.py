"""Reliability under load and under kill -9, at reduced size (full size: benchmarks/perf/load.py
and benchmarks/perf/crash.py, or the slow tests here)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from benchmarks.perf import crash, load
from memrl_cli.ops import inspection
from memrl_cli.bank import MemoryBank



def test_parallel_processes_lose_nothing(tmp_path: Path) -> None:
    report = load.run_load(str(tmp_path / "load.db"), processes=4, operations=40)
    assert report.errors == [] and report.locked_errors == 0
    assert report.problems == []
    assert report.memories == load.HOT_MEMORIES + 4 * 40
    # every operation was acknowledged: 40 ingests and 40 rewards of 3 memories each per process, half after a retrieval
    assert (report.retrievals, report.ledger_rows) == (4 * 20, 4 * 40 * 3)


@pytest.mark.slow
def test_eight_processes_five_hundred_operations_each(tmp_path: Path) -> None:
    report = load.run_load(str(tmp_path / "load.db"), processes=8, operations=500)
    assert report.ok, report.errors[:5] + report.problems


def cli(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "MEMRL_DB"}
    return subprocess.run([sys.executable, "-m", "memrl_cli", *args, "--db", str(db), "--json"], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_parallel_cli_processes_lose_nothing(tmp_path: Path) -> None:
    """`xargs -P 4`-style: 16 `memrl` processes, 4 at a time, half ingesting, half rewarding the same two memories."""
    db = tmp_path / "cli.db"
    rng = np.random.default_rng(0)
    vec = lambda: json.dumps([float(x) for x in rng.normal(size=8)])  # noqa: E731
    for i in (1, 2):
        assert cli(db, "ingest", "--intent", f"hot {i}", "--experience", "x", "--vector", vec(),
                   "--embedder", "external:cli:8").returncode == 0
    commands = []
    for i in range(8):
        commands.append(["ingest", "--intent", f"task {i}", "--experience", f"did {i}", "--vector", vec()])
        commands.append(["reward", "--memory", "1", "--memory", "2", "--reward", "1" if i % 2 else "-1"])
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda args: cli(db, *args), commands))
    failures = [(c, d.stderr) for c, d in zip(commands, done) if d.returncode != 0]
    assert failures == []
    assert not any("locked" in d.stderr for d in done)
    created = [json.loads(d.stdout)["id"] for c, d in zip(commands, done) if c[0] == "ingest"]
    updates = [u for c, d in zip(commands, done) if c[0] == "reward" for u in json.loads(d.stdout)["updated"]]
    with MemoryBank(db, create=False) as bank:
        report = inspection.verify(bank)
        assert report["ok"], report
        assert bank.count() == 10 and len(set(created)) == 8
        assert report["ledger_rows"] == len(updates) == 16
        visits = dict(bank.conn.execute("SELECT id, visits FROM memories WHERE visits > 0").fetchall())
        assert visits == {1: 8, 2: 8} == dict(Counter(u["id"] for u in updates))


def test_kill_during_bulk_ingest(tmp_path: Path) -> None:
    report = crash.crash_ingest(tmp_path, repeats=4, rng=random.Random(1))
    assert report.problems == []
    assert report.kills == 4


def test_kill_during_rewards(tmp_path: Path) -> None:
    report = crash.crash_reward(tmp_path, repeats=4, rng=random.Random(2))
    assert report.problems == []
    assert report.kills == 4


@pytest.mark.slow
def test_kill_during_benchmark_run_resumes_to_the_same_metrics(tmp_path: Path) -> None:
    report = crash.crash_bench(tmp_path, repeats=1, rng=random.Random(3), rooms=4, epochs=2)
    assert report.problems == []
    assert report.kills + report.finished_before_kill == 1


@pytest.mark.slow
def test_many_kills(tmp_path: Path) -> None:
    rng = random.Random(4)
    reports = [crash.crash_ingest(tmp_path, 10, rng), crash.crash_reward(tmp_path, 10, rng),
               crash.crash_bench(tmp_path, 3, rng)]
    assert [p for r in reports for p in r.problems] == []
