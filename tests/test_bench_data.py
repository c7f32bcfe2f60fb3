"""Where the benchmark tests find data (tests/bench_data.py): where the tool looks first, the samples committed in
tests/data/, and a skip that says how to get what is missing (a failure under CI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import bench_data
import pytest

from memrl_bench.adapters import llb_common
from memrl_bench.adapters.alfworld import data as alfworld_data
from memrl_bench.adapters.bigcodebench.benchmark import BigCodeBench

TESTS = Path(__file__).resolve().parent


def test_data_is_found_where_the_tool_finds_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    games = tmp_path / "alfworld"
    (games / "json_2.1.1" / "valid_unseen").mkdir(parents=True)
    monkeypatch.setenv("ALFWORLD_DATA", str(games))
    assert bench_data.alfworld() == alfworld_data.resolve_data_dir(None) == games.resolve()
    monkeypatch.delenv("ALFWORLD_DATA")
    monkeypatch.setenv("HOME", str(tmp_path))  # where alfworld-download puts the games
    (tmp_path / ".cache" / "alfworld" / "json_2.1.1").mkdir(parents=True)
    assert bench_data.alfworld() == (tmp_path / ".cache" / "alfworld").resolve()

    llb = tmp_path / "llb"
    llb.mkdir()
    (llb / "db_val.json").write_text("{}")
    monkeypatch.setenv("LLB_DATA", str(llb))
    assert bench_data.directory("llb", "db_val.json") == llb_common.data_dir(None, ("db_val.json",)) == llb
    assert bench_data.directory("llb", "os_interaction_val.json") == bench_data.SHARED / "llb"  # not there: fallback

    bcb = tmp_path / "bcb"
    bcb.mkdir()
    (bcb / "bigcodebench_full.jsonl").write_text((bench_data.BIGCODEBENCH_SAMPLE / "bigcodebench_full.jsonl").read_text())
    monkeypatch.setenv("BIGCODEBENCH_DATA", str(bcb))
    assert bench_data.directory("bigcodebench", "bigcodebench_full.jsonl") == bcb
    # ... which is where the adapter reads its tasks from without --data
    assert len(BigCodeBench(sandbox="none").tasks("train") + BigCodeBench(sandbox="none").tasks("val")) == 20


def test_without_data_the_developers_copy_is_the_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ALFWORLD_DATA", "LLB_DATA", "BIGCODEBENCH_DATA"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(bench_data, "SHARED", tmp_path / "shared" / "data")
    assert bench_data.alfworld() is None
    assert bench_data.directory("llb", "db_val.json") == tmp_path / "shared" / "data" / "llb"
    archive = tmp_path / "shared" / "data" / "alfworld" / "json_2.1.1_full_with_traj.tar.xz"
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"")
    assert bench_data.alfworld() == archive
    assert bench_data.missing("llb", bench_data.directory("llb", "db_val.json")) == (
        f"llb data not found (not where the tool looks, nor in the developers' copy {tmp_path}/shared/data/llb): "
        f"{llb_common.DATA_HINT}")


def test_the_samples_are_small_complete_and_documented() -> None:
    with tarfile.open(bench_data.ALFWORLD_SAMPLE) as tar:
        names = [m.name for m in tar.getmembers() if m.isfile()]
        unpacked = sum(m.size for m in tar.getmembers())
    games = sorted(name.split("/")[2] for name in names if name.endswith("/game.tw-pddl"))
    assert len(games) == 6 and {name.split("-")[0] for name in games} == set(alfworld_data.TASK_TYPES)
    assert all(name.startswith("json_2.1.1/valid_unseen/") for name in names) and unpacked < 600_000
    examples = json.loads(bench_data.ALFWORLD_SAMPLE_EXAMPLES.read_text())
    assert sorted(item["task"] for item in examples) == sorted(alfworld_data.SHORT_TYPES)
    rows = (bench_data.BIGCODEBENCH_SAMPLE / "bigcodebench_full.jsonl").read_text().splitlines()
    assert [json.loads(row)["task_id"] for row in rows] == [f"BigCodeBench/{n}" for n in range(20)]
    committed = [p for p in bench_data.SAMPLES.rglob("*") if p.is_file() and "bank_" not in p.name]
    assert sum(p.stat().st_size for p in committed) < 300_000
    readme = (bench_data.SAMPLES / "README.md").read_text()
    for documented in ("json_2.1.1_sample.tar.xz", "examples_from_walkthroughs.json", "bigcodebench_full.jsonl",
                       "MIT", "Apache", "make_samples.py"):
        assert documented in readme


MISSING = """
from pathlib import Path

import bench_data


@bench_data.needs("llb", Path("/nonexistent/llb/db_val.json"))
def test_marked():
    pass


def test_called():
    bench_data.unavailable("alfworld")
"""


@pytest.mark.parametrize("ci", ["", "true"])
def test_missing_data_skips_saying_how_to_get_it_and_fails_under_ci(tmp_path: Path, ci: str) -> None:
    (tmp_path / "test_missing.py").write_text(MISSING)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")} | {
        "CI": ci, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent), str(TESTS.parent / "benchmarks"),
                                                  os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rsf", "-p", "no:cacheprovider", "-p", "conftest",
                           "-W", "ignore::pytest.PytestUnknownMarkWarning", "test_missing.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    if ci:
        assert done.returncode == 1 and "1 failed" in done.stdout and "1 error" in done.stdout, done.stdout + done.stderr
        assert "llb data is required under CI" in done.stdout and "alfworld data is required under CI" in done.stdout
    else:
        assert done.returncode == 0 and "2 skipped" in done.stdout, done.stdout + done.stderr
    assert f"llb data not found (looked in /nonexistent/llb): {llb_common.DATA_HINT}" in done.stdout.replace("\n", " ")
    assert "alfworld data not found: get the ALFWorld games with `pip install alfworld==0.4.2 && alfworld-download`" \
        in done.stdout
