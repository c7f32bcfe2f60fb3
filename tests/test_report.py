"""`memrl report`: where learning stalls, counted from a real run's receipts and reward ledger.

Each case is a run of the passcode benchmark (benchmarks/testing/toy_benchmark.py: a room's memory helps only
if it carries that room's code) through `run_benchmark` with a scripted chat server, small
enough to follow by hand. One room, k2 = 1, rag (similarity only).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks.testing.chat_server import ScriptedChatServer
from benchmarks.testing.toy_benchmark import code, responder

from memrl_bench.framework.config import BenchConfig
from memrl_bench.framework.harness import run_benchmark
from memrl_cli.bank import MemoryBank
from memrl_bench.framework.llm import LLMSettings
from memrl_cli.ops.report import learning_report

TOY = "benchmarks.testing.toy_benchmark:Passcodes"
COUNTS = ("episodes", "successes", "receipts", "existed", "recalled", "selected")


@pytest.fixture(scope="module")
def server():
    with ScriptedChatServer(responder) as s:
        yield s


def run(server: ScriptedChatServer, tmp_path: Path, k1: int, epochs: int, seeded: bool) -> Path:
    """A one-room run; `seeded` first stores a differently worded memory that carries the room's code."""
    bank_path = tmp_path / "bank.db"
    if seeded:
        with MemoryBank(bank_path) as bank:
            bank.ingest("Which code opens the door of room 1?", f"Remember: the passcode of room 1 is {code(1)}.",
                        "success")  # similar to the task (cosine 0.72), but not the same intent (< 0.9)
    config = BenchConfig(benchmark=TOY, method="rag", epochs=epochs, batch_size=1, k1=k1, k2=1, threshold=0.3,
                         options={"rooms": 1})
    settings = LLMSettings(model="scripted", base_url=server.base_url, api_key="test")
    run_benchmark(config, settings, bank_path=str(bank_path), runs_dir=str(tmp_path), workers=0)
    return next(tmp_path.glob("*/config.json")).parent


def counts(report: dict) -> list[tuple[int, ...]]:
    return [tuple(row[c] for c in COUNTS) for row in report["epochs"]]


def test_useful_memory_recalled_but_not_selected(server, tmp_path):
    """Epoch 1 the seeded memory M is the only candidate: selected, success, so M proved useful.
    Epoch 2 the epoch-1 script (same wording as the task, similarity 1, no code) outranks M:
    M is recalled (k1 = 2) but not selected, and the episode fails."""
    report = learning_report(run(server, tmp_path, k1=2, epochs=2, seeded=True))
    assert report["method"] == "rag" and report["useful_pairs"] == 1
    assert counts(report) == [(1, 1, 1, 1, 1, 1), (1, 0, 1, 1, 1, 0)]


def test_useful_memory_existing_but_not_recalled(server, tmp_path):
    """The same run with k1 = 1: in epoch 2 the script (the task's own intent) alone is recalled, so M exists
    but is not recalled."""
    report = learning_report(run(server, tmp_path, k1=1, epochs=2, seeded=True))
    assert report["useful_pairs"] == 1
    assert counts(report) == [(1, 1, 1, 1, 1, 1), (1, 0, 1, 1, 0, 0)]


def test_useful_memory_counts_only_once_it_exists(server, tmp_path):
    """No seed: epoch 1 fails with an empty bank (a receipt with no candidates); its reflection carries
    the code, is selected in epoch 2 and succeeds: useful, but it did not exist in epoch 1."""
    report = learning_report(run(server, tmp_path, k1=1, epochs=2, seeded=False))
    assert report["useful_pairs"] == 1
    assert counts(report) == [(1, 0, 1, 0, 0, 0), (1, 1, 1, 1, 1, 1)]
    assert [row["accuracy"] for row in report["epochs"]] == [0.0, 1.0]


def test_no_memory_run_has_episodes_and_no_receipts(server, tmp_path):
    config = BenchConfig(benchmark=TOY, method="none", epochs=2, batch_size=2, options={"rooms": 2})
    settings = LLMSettings(model="scripted", base_url=server.base_url, api_key="test")
    summary = run_benchmark(config, settings, runs_dir=str(tmp_path), workers=0)
    report = learning_report(Path(summary["bank"]).parent)
    assert report["useful_pairs"] == 0 and counts(report) == [(2, 0, 0, 0, 0, 0), (2, 0, 0, 0, 0, 0)]


def test_report_command_json_table_and_bad_input(server, tmp_path):
    run_dir = run(server, tmp_path, k1=2, epochs=2, seeded=True)
    cli = [sys.executable, "-m", "memrl_cli", "report"]
    as_json = subprocess.run(cli + [str(run_dir), "--json"], capture_output=True, text=True, check=True)
    assert json.loads(as_json.stdout) == learning_report(run_dir)
    shown = subprocess.run(cli + [str(run_dir)], capture_output=True, text=True, check=True)
    assert "recalled" in shown.stdout and "proved useful" in shown.stdout
    missing = subprocess.run(cli + [str(tmp_path / "nope")], capture_output=True, text=True)
    assert missing.returncode != 0 and missing.stdout == ""
    assert missing.stderr.strip() == f"memrl: error: {tmp_path / 'nope'} is not a run directory (no readable config.json)"


def test_utility_report_of_a_real_run(tmp_path):
    """`memrl report RUN --q` on a real testbed run (memrl, scenario a: a memory is useful exactly for its own task):
    the success rate by Q bin and Spearman's ρ per epoch, printed, in utility.json and drawn in utility.png. Q learned
    from rewards predicts success there, so ρ is positive over the run."""
    from benchmarks.learning.table import ADAPTER, NO_LLM
    from memrl_cli.ops.report import spearman, utility_report

    config = BenchConfig(benchmark=ADAPTER, method="memrl", epochs=4, batch_size=8, threshold=0.3, seed=1,
                         options={"scenario": "a"})
    summary = run_benchmark(config, NO_LLM, runs_dir=str(tmp_path), workers=0)
    run_dir = tmp_path / summary["run_id"]
    env = {"PYTHONPATH": f"{Path(__file__).parent}:{Path(__file__).parents[1]}"}
    done = subprocess.run([sys.executable, "-m", "memrl_cli", "report", str(run_dir), "--q", "--json"],
                          capture_output=True, text=True, env=env | {"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    analysis = json.loads(done.stdout)
    assert [e["epoch"] for e in analysis["epochs"]] == [1, 2, 3, 4]
    assert analysis["overall"]["selections"] == sum(b["selections"] for b in analysis["overall"]["bins"]) > 0
    assert analysis["overall"]["spearman"] > 0.2
    assert json.loads((run_dir / "utility.json").read_text()) == analysis
    assert (run_dir / "utility.png").read_bytes()[:4] == b"\x89PNG"
    human = subprocess.run([sys.executable, "-m", "memrl_cli", "report", str(run_dir), "--q"],
                           capture_output=True, text=True, env=env | {"PATH": "/usr/bin:/bin", "COLUMNS": "80"})
    assert human.returncode == 0 and "Spearman" in human.stdout and "epoch" in human.stdout
    for b in analysis["overall"]["bins"]:  # every bin, even where the columns are wider than the terminal
        assert f"Q [{b['low']:+.1f},{b['high']:+.1f})" in human.stdout, human.stdout
    moved = tmp_path / "handed-over" / run_dir.name  # to another place, or machine: the directory carries its bank
    shutil.move(run_dir, moved)
    assert json.loads(json.dumps(utility_report(moved))) == analysis
    assert spearman([1, 2, 3, 4], [0, 0, 1, 1]) == pytest.approx(0.8944, abs=1e-3)
    assert spearman([1, 1, 1], [0, 1, 0]) is None
