"""The runtime-learning harness end to end on the passcode benchmark (benchmarks/testing/toy_benchmark.py),
with a real Chat Completions server on 127.0.0.1 answering from a script."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import conftest
import pytest
from benchmarks.testing.chat_server import ScriptedChatServer
from benchmarks.testing.toy_benchmark import responder

from memrl_bench.framework import metrics
from memrl_bench.framework.config import BenchConfig, parse_eval_limit
from memrl_bench.framework.harness import Run, run_benchmark
from memrl_bench.framework.pool import episode_groups
from memrl_bench.framework.protocol import Episode, Task
from memrl_cli.ops import inspection
from memrl_cli.ops import runs
from memrl_cli.bank import MemoryBank
from memrl_cli.errors import MemrlError
from memrl_bench.framework.llm import LLMSettings

TOY = "benchmarks.testing.toy_benchmark:Passcodes"
TESTS = Path(__file__).parent

PLOTS = importlib.util.find_spec("matplotlib") is not None


@pytest.fixture(scope="module")
def server():
    with ScriptedChatServer(responder) as s:
        yield s


def settings(server) -> LLMSettings:
    return LLMSettings(model="scripted", base_url=server.base_url, api_key="sk-test-planted-key-000000000000")


def test_memrl_learns_across_epochs(server, tmp_path):
    config = BenchConfig(benchmark=TOY, method="memrl", epochs=3, batch_size=4, eval_splits=["val"],
                         threshold=0.3, options={"rooms": 6})
    summary = run_benchmark(config, settings(server), runs_dir=str(tmp_path), workers=0)
    # epoch 1: nothing remembered, every guess fails; then the reflections carry the codes
    assert summary["accuracy"] == {1: 0.0, 2: 1.0, 3: 1.0}
    assert summary["csr"] == {1: 0.0, 2: 1.0, 3: 1.0}
    assert summary["eval_accuracy"]["val"] == {0: 0.0, 1: 1.0, 2: 1.0, 3: 1.0}
    assert summary["forgetting_rate"] == 0.0
    run_dir = tmp_path / summary["run_id"]
    records = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert len(records) == 3 * 6 + 4 * 6
    recomputed = metrics.summarise(records)
    written = json.loads((run_dir / "summary.json").read_text())
    assert {k: written[k] for k in recomputed} == json.loads(json.dumps(recomputed))
    train = [r for r in records if r["phase"] == "train"]
    assert all(r["retrieval_id"] is not None and r["new_memory_id"] is not None for r in train)
    assert all(r["retrieval_id"] is None and r["new_memory_id"] is None for r in records if r["phase"] == "eval")
    assert all(r["memory_ids"] for r in train if r["epoch"] > 1)
    with MemoryBank(summary["bank"]) as bank:
        # one memory per training episode (the paper: epochs 2 and 3 play identically, and their identical
        # memories are stored apart; the `dedup` switch would keep one), none from evaluation
        assert bank.count() == 18
        assert len({r["new_memory_id"] for r in train}) == 18
        report = inspection.verify(bank)
        assert report["ok"], report
        assert report["ledger_rows"] == sum(len(r["memory_ids"]) for r in train)
        qs = [m["q"] for m in inspection.top_q(bank, 12)]
        assert max(qs) > 0  # memories injected into successes gained utility
        run = runs.get_run(bank, summary["run_id"])
        assert run["config"]["method"] == "memrl" and run["models"]["agent"] == "scripted"
        assert run["status"] == "finished"
    if PLOTS:  # the plots extra draws the curves; without it the run says so and skips them
        assert (run_dir / "learning_curve.png").stat().st_size > 1000
    stored = (run_dir / "config.json").read_text() + (run_dir / "summary.json").read_text()
    assert "sk-test-planted-key" not in stored


def test_rewards_outside_the_bank_s_range_stop_the_run_before_any_episode(server, tmp_path):
    """A success reward of 2 on a bank that accepts [-1, 1] would fail the first commit: refused up front;
    once the bank's range holds it, the run learns with it."""
    from memrl_cli.errors import MemrlError

    config = BenchConfig(benchmark=TOY, method="memrl", epochs=1, batch_size=3, success_reward=2.0,
                         options={"rooms": 3})
    bank = str(tmp_path / "bank.db")
    with pytest.raises(MemrlError, match=r"^success_reward 2 lies outside the bank's reward range \[-1, 1\]"):
        run_benchmark(config, settings(server), bank_path=bank, runs_dir=str(tmp_path / "runs"), workers=0)
    with MemoryBank(bank) as opened:
        assert opened.count() == 0 and opened.store.receipt_count() == 0
        opened.set_reward_range((-2, 2))
    assert not list((tmp_path / "runs").glob("*/config.json"))  # no run started
    summary = run_benchmark(config, settings(server), bank_path=bank, runs_dir=str(tmp_path / "runs"), workers=0)
    assert summary["episodes"] == 3


def test_none_method_never_learns_and_writes_no_memory(server, tmp_path):
    config = BenchConfig(benchmark=TOY, method="none", epochs=2, batch_size=3, options={"rooms": 3})
    summary = run_benchmark(config, settings(server), runs_dir=str(tmp_path), workers=0)
    assert summary["accuracy"] == {1: 0.0, 2: 0.0}
    with MemoryBank(summary["bank"]) as bank:
        assert bank.count() == 0


def test_worker_processes_give_the_same_results(server, tmp_path):
    config = BenchConfig(benchmark=TOY, method="rag", epochs=2, batch_size=4, threshold=0.3, options={"rooms": 4})
    summary = run_benchmark(config, settings(server), runs_dir=str(tmp_path), workers=2)
    assert summary["accuracy"] == {1: 0.0, 2: 1.0}
    assert summary["usage"]["calls"] == 2 * 4 * 2  # an agent call and a distil call per training episode


def learned(summary: dict) -> dict:
    """Everything a run decided: its episode records, memories, receipts and reward ledger (no times, no run id)."""
    episodes = [json.loads(line) for line in (Path(summary["bank"]).parent / "episodes.jsonl").read_text().splitlines()]
    with MemoryBank(summary["bank"], create=False) as bank:
        rows = {table: [tuple(r) for r in bank.conn.execute(query)] for table, query in (
            ("memories", "SELECT id, intent, experience, outcome, task_id, q, visits FROM memories ORDER BY id"),
            ("receipts", "SELECT r.id, r.query, c.memory_id, c.recall_rank, c.similarity, c.q, c.score, c.selected_rank "
                         "FROM retrievals r JOIN retrieval_candidates c ON c.retrieval_id = r.id ORDER BY r.id, c.memory_id"),
            ("ledger", "SELECT retrieval_id, memory_id, reward, q_before, q_after FROM rewards ORDER BY id"))}
    return {"episodes": episodes, **rows}


def slow_responder(delay: float):
    """The toy's scripted LLM, answering each request after `delay` seconds (so episodes overlap)."""
    return lambda request: {"content": responder(request), "delay": delay}


@pytest.mark.slow
def test_concurrency_changes_neither_results_nor_receipts(tmp_path):
    """Episodes in flight on threads (in this process, and in 2 worker processes) learn exactly what one at a time does."""
    config = dict(benchmark=TOY, method="memrl", epochs=2, batch_size=4, eval_splits=["val"], threshold=0.3,
                  options={"rooms": 4})
    got = {}
    for workers, concurrency in ((0, 1), (0, 4), (2, 3)):
        with ScriptedChatServer(slow_responder(0.1)) as server:
            summary = run_benchmark(BenchConfig(**config), LLMSettings(model="scripted", base_url=server.base_url,
                                                                       api_key="test", concurrency=concurrency),
                                    runs_dir=str(tmp_path / f"{workers}-{concurrency}"), workers=workers)
            got[workers, concurrency] = learned(summary), server.max_in_flight, len(server.requests)
        stored = json.loads((Path(summary["bank"]).parent / "config.json").read_text())
        assert stored["llm"]["concurrency"] == concurrency
    sequential, in_flight, calls = got[0, 1]
    assert in_flight == 1 and sequential["episodes"][-1]["success"] and sequential["ledger"]
    for (workers, concurrency), (state, in_flight, n) in got.items():
        assert state == sequential and n == calls, (workers, concurrency)
        assert 1 < in_flight <= concurrency or concurrency == 1, (workers, concurrency, in_flight)


def test_concurrency_defaults_to_the_batch_size(server, tmp_path):
    config = BenchConfig(benchmark=TOY, method="none", epochs=1, batch_size=3, options={"rooms": 3})
    summary = run_benchmark(config, settings(server), runs_dir=str(tmp_path), workers=0)
    stored = json.loads((Path(summary["bank"]).parent / "config.json").read_text())
    assert stored["llm"]["concurrency"] == 3


@pytest.mark.parametrize("n, processes, concurrency", [(32, 2, 32), (32, 4, 8), (5, 2, 3), (2, 4, 32), (7, 3, 1)])
def test_episode_groups_deal_every_position_once_within_the_limit(n, processes, concurrency):
    groups = episode_groups(n, processes, concurrency, threaded=True)
    assert sorted(i for positions, _ in groups for i in positions) == list(range(n))
    assert len(groups) <= processes and sum(threads for _, threads in groups) == min(concurrency, n)
    assert all(1 <= threads <= len(positions) for positions, threads in groups)
    assert episode_groups(n, processes, concurrency, threaded=False) == [([i], 1) for i in range(n)]


def test_bad_concurrency_is_one_line_and_writes_nothing(tmp_path):
    from memrl_bench.framework.session import bench

    from memrl_cli.errors import MemrlError

    result = subprocess.run(bench_cmd_plain(tmp_path, "http://127.0.0.1:9/v1") + ["--concurrency", "0"],
                            env=cli_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr == "memrl: error: --concurrency must be at least 1 (episodes and LLM requests in flight), got 0\n"
    with pytest.raises(MemrlError, match="--concurrency must be at least 1 .*, got -2$"):
        bench(TOY, None, {}, {}, config=None, llm_flags={"base_url": "http://127.0.0.1:9/v1", "concurrency": -2},
              local_llm=False, workers=0, runs_dir=str(tmp_path), resume=None, db=None, show_progress=False)
    assert not list(tmp_path.iterdir())


def bench_cmd(server, runs_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "memrl_cli", "bench", TOY, "--epochs", "3", "--batch-size", "2",
            "--threshold", "0.3", "--runs-dir", str(runs_dir), "--workers", "0", "--base-url", server.base_url,
            "--model", "scripted", "--json", *extra]


def cli_env() -> dict[str, str]:
    return conftest.cli_env(OPENAI_API_KEY="sk-test-planted-key-000000000000")


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_metrics(server, tmp_path):
    options = ["--option", "rooms=6", "--option", "delay=0.15"]
    full = subprocess.run(bench_cmd(server, tmp_path / "full", *options, "--concurrency", "1"), env=cli_env(),
                          capture_output=True, text=True, timeout=300)
    assert full.returncode == 0, full.stderr
    expected = json.loads(full.stdout)

    proc = subprocess.Popen(bench_cmd(server, tmp_path / "killed", *options, "--concurrency", "2"), env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 120
    bank_path = None
    while time.time() < deadline:  # kill -9 once a few mini-batches have been committed
        found = list((tmp_path / "killed").glob("*/bank.db"))
        if found:
            bank_path = found[0]
            try:
                with MemoryBank(bank_path, create=False) as bank:
                    done = bank.conn.execute("SELECT count(*) FROM run_batches").fetchone()[0]
            except Exception:
                done = 0
            if done >= 4:
                break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert bank_path is not None
    with MemoryBank(bank_path, create=False) as bank:
        assert inspection.verify(bank)["ok"]
        assert bank.conn.execute("SELECT count(*) FROM run_batches").fetchone()[0] < 9  # really interrupted

    run_dir = bank_path.parent
    resumed = subprocess.run(bench_cmd(server, tmp_path / "killed", "--resume", str(run_dir), "--concurrency", "2"),
                             env=cli_env(),
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    got = json.loads(resumed.stdout)
    for key in ("accuracy", "csr", "forgetting", "last_epoch_accuracy", "final_csr", "mean_steps", "episodes"):
        assert got[key] == expected[key], key
    with MemoryBank(bank_path, create=False) as bank:
        assert bank.count() == 18 and inspection.verify(bank)["ok"]  # a memory per training episode (the paper)


def test_bench_errors_are_one_line(tmp_path):
    result = conftest.run_memrl("bench", "no-such-bench", "--base-url", "http://127.0.0.1:9/v1", "--runs-dir",
                                str(tmp_path), ok=False, timeout=60)
    assert result.returncode == 1
    assert conftest.error_line(result).startswith("memrl: error: unknown benchmark 'no-such-bench'")


def test_unreachable_endpoint_fails_before_any_work(tmp_path):
    result = subprocess.run(bench_cmd_plain(tmp_path, "http://127.0.0.1:9/v1"), env=cli_env(), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1
    assert "127.0.0.1:9" in result.stderr and "not reachable" in result.stderr
    assert not list(tmp_path.glob("*/bank.db"))


def bench_cmd_plain(runs_dir: Path, base_url: str) -> list[str]:
    return [sys.executable, "-m", "memrl_cli", "bench", TOY, "--runs-dir", str(runs_dir), "--base-url", base_url,
            "--workers", "0"]


def test_limit_bounds_the_evaluation_too_unless_eval_limit_says_otherwise(server, tmp_path):
    """--limit N plays N tasks of each evaluation split per pass (stored with the run); --eval-limit M plays M,
    `all` every one. A run stored before this rule (limit, no eval_limit) resumes with its full splits."""
    from dataclasses import asdict

    def played(**given):
        config = BenchConfig(benchmark=TOY, method="none", epochs=2, limit=2, eval_splits=["val"],
                             options={"rooms": 5}, **given)
        summary = run_benchmark(config, settings(server), runs_dir=str(tmp_path / "runs"), workers=0)
        stored = json.loads((Path(summary["run_dir"]) / "config.json").read_text())["config"]
        records = [json.loads(line) for line in (Path(summary["run_dir"]) / "episodes.jsonl").read_text().splitlines()]
        evals = [r for r in records if r["phase"] == "eval"]
        assert {r["epoch"] for r in evals} == {0, 1, 2}  # before training and after each epoch
        return stored["eval_limit"], sum(r["phase"] == "train" for r in records), len(evals)

    assert played() == (2, 2 * 2, 2 * 3)  # three passes of 2 rooms, not of all 5
    assert played(eval_limit=3) == (3, 2 * 2, 3 * 3)
    assert played(eval_limit="all") == ("all", 2 * 2, 5 * 3)
    with pytest.raises(MemrlError, match="eval_limit must be a whole number of at least 1 or `all`, got 'some'"):
        BenchConfig(benchmark=TOY, eval_limit="some")
    assert (parse_eval_limit("4"), parse_eval_limit("all"), parse_eval_limit(None)) == (4, "all", None)
    with pytest.raises(MemrlError, match="--eval-limit takes a number of tasks or `all`, got 'most'"):
        parse_eval_limit("most")

    old_run = tmp_path / "old-run"  # written by an earlier memrl, killed right after its config.json
    old_run.mkdir()
    old = BenchConfig(benchmark=TOY, method="none", epochs=1, limit=2, eval_splits=["val"], options={"rooms": 5})
    (old_run / "config.json").write_text(json.dumps({"run_id": "old", "bank": str(old_run / "bank.db"),
                                                     "config": asdict(old)}))
    summary = run_benchmark(old, settings(server), resume=str(old_run), workers=0)
    assert summary["episodes"] == 2 + 5 * 2  # its evaluation as it was: every room


def test_method_settings_are_resolved_before_any_run(tmp_path):
    from memrl_bench.framework.session import bench

    from memrl_cli.errors import MemrlError

    def run(methods, flags=None, config=None):
        return bench(TOY, methods, {"epochs": 1, **(flags or {})}, {"rooms": 1}, config=config,
                     llm_flags={"base_url": "http://127.0.0.1:9/v1"}, local_llm=False, workers=0,
                     runs_dir=str(tmp_path), resume=None, db=None, show_progress=False)

    with pytest.raises(MemrlError, match="unknown method 'bogus'"):
        run("memrl,bogus")  # refused before memrl starts (the endpoint is never reached)
    with pytest.raises(MemrlError, match="rag is similarity-only"):
        BenchConfig(benchmark=TOY, method="rag", lam=0.3)
    config = tmp_path / "bench.yaml"
    config.write_text("bench:\n  method: none\n  options: [1]\n")
    with pytest.raises(MemrlError, match="options:"):
        run(None, config=str(config))
    assert not list(tmp_path.glob("*/"))


def test_lambda_override_applies_to_memrl_only_and_config_method_is_used(server, tmp_path):
    from memrl_bench.framework.session import bench

    config = tmp_path / "bench.yaml"
    config.write_text("bench:\n  method: memrl,rag\n  epochs: 1\n")
    summaries = bench(TOY, None, {"lam": 0.3}, {"rooms": 2}, config=str(config), llm_flags={"base_url": server.base_url},
                      local_llm=False, workers=0, runs_dir=str(tmp_path / "runs"), resume=None, db=None,
                      show_progress=False)
    lams = {s["method"]: json.loads((Path(s["bank"]).parent / "config.json").read_text())["config"]["lam"]
            for s in summaries}
    assert lams == {"memrl": 0.3, "rag": 0.0}
    if PLOTS:  # the plots extra draws the curves; without it the run says so and skips them
        assert Path(summaries[0]["comparison_plot"]).stat().st_size > 1000


def test_resume_of_something_that_is_not_a_run_is_one_line(tmp_path):
    result = conftest.run_memrl("bench", TOY, "--resume", str(tmp_path), "--base-url", "http://127.0.0.1:9/v1",
                                ok=False, timeout=60)
    assert result.returncode == 1
    assert "is not a run directory" in conftest.error_line(result)


@pytest.mark.slow
def test_bench_never_learns_in_memrl_db_and_names_its_bank_first(server, tmp_path):
    agent_bank = tmp_path / "agent.db"
    env = cli_env() | {"MEMRL_DB": str(agent_bank)}
    result = subprocess.run(bench_cmd(server, tmp_path / "runs", "--epochs", "1", "--option", "rooms=2"), env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[0] == (f"memrl: bank: a new bank.db in its run directory under "
                                             f"{tmp_path / 'runs'}/; MEMRL_DB={agent_bank} is not used by bench")
    assert not agent_bank.exists() and json.loads(result.stdout)["bank"].endswith("bank.db")
    named = subprocess.run(bench_cmd(server, tmp_path / "runs", "--epochs", "1", "--option", "rooms=2",
                                     "--db", str(agent_bank)), env=env, capture_output=True, text=True, timeout=300)
    assert named.returncode == 0, named.stderr
    assert named.stderr.splitlines()[0] == f"memrl: bank: {agent_bank} (--db)"
    with MemoryBank(agent_bank, create=False) as bank:
        assert bank.count() == 2


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_named_model_without_key_or_endpoint_is_one_line(tmp_path, how):
    named = ["--model", "gpt-4o-mini"] if how == "flag" else []
    result = conftest.run_memrl("bench", TOY, "--runs-dir", str(tmp_path), "--workers", "0", *named, ok=False,
                                env={} if how == "flag" else {"MEMRL_MODEL": "gpt-4o-mini"}, timeout=60)
    assert result.returncode == 1
    line = conftest.error_line(result)
    assert line.startswith("memrl: error: model 'gpt-4o-mini' is named")
    assert "OPENAI_API_KEY" in line and "--base-url" in line
    assert not list(tmp_path.iterdir())


def test_progress_knows_the_total_number_of_episodes(server, tmp_path):
    events = []
    config = BenchConfig(benchmark=TOY, method="memrl", epochs=3, batch_size=4, eval_splits=["val"], eval_every=2,
                         threshold=0.3, options={"rooms": 3})
    run_benchmark(config, settings(server), runs_dir=str(tmp_path), workers=0,
                  on_progress=lambda event, data: events.append((event, data)))
    start = next(data for event, data in events if event == "start")
    assert start == {"total": 3 * 3 + 3 * 3, "done": 0}  # evaluations after epochs 0, 2 and 3
    assert sum(1 for event, _ in events if event == "episode") == start["total"]


def test_the_last_batch_of_a_stream_has_the_next_streams_first_games_loaded(tmp_path, monkeypatch):
    """Each batch is handed the next batch's games to load, also across the end of a stream: held-out splits
    before training, each training epoch, held-out splits after it. Not pass@k's epochs after the first, whose
    tasks (those no earlier epoch solved) are known only once the epochs before are played; nothing after the
    last stream."""
    seen = []
    monkeypatch.setattr(Run, "play_batch", lambda self, pool, batch, upcoming=(), batches=1: seen.append(
        (batch.phase, batch.epoch, [t.id for t in batch.tasks], [t.id for t in upcoming])))
    train = [Task(f"t{i}", f"task t{i}", i) for i in range(3)]
    evals = {"val": [Task(f"v{i}", f"task v{i}", i) for i in range(2)]}
    expected = {
        "memrl": [("eval", 0, ["v0", "v1"], ["t0", "t1"]),
                  ("train", 1, ["t0", "t1"], ["t2"]), ("train", 1, ["t2"], ["v0", "v1"]),
                  ("eval", 1, ["v0", "v1"], ["t0", "t1"]),
                  ("train", 2, ["t0", "t1"], ["t2"]), ("train", 2, ["t2"], ["v0", "v1"]),
                  ("eval", 2, ["v0", "v1"], [])],
        "pass@k": [("eval", 0, ["v0", "v1"], ["t0", "t1"]),
                   ("train", 1, ["t0", "t1"], ["t2"]), ("train", 1, ["t2"], ["v0", "v1"]),
                   ("eval", 1, ["v0", "v1"], []),
                   ("train", 2, ["t0", "t1"], ["t2"]), ("train", 2, ["t2"], ["v0", "v1"]),
                   ("eval", 2, ["v0", "v1"], [])]}
    for method, batches in expected.items():
        seen.clear()
        events = []
        config = BenchConfig(benchmark=TOY, method=method, epochs=2, batch_size=2, eval_splits=["val"])
        with MemoryBank(str(tmp_path / f"{method}.db")) as bank:
            Run(config, bank, "run", tmp_path, train, evals, lambda event, data: events.append(event)).loop(pool=None)
        assert seen == batches, method
        assert events == ["start", "epoch", "epoch_done", "epoch", "epoch_done"]


class Preloading:
    """An LLM-free, thread-safe adapter whose environments load ahead (`prepare`), so the harness pins its worker
    processes: an episode is won only if its environment was prepared for it in its process, and takes 2 steps
    when that load was one for a later batch (`later()` true when it ran), else 1. Each game takes 0.2 s: time
    for the loads of the next batch to run while it is played."""

    name, train_split, eval_splits, thread_safe, uses_llm = "preloading", "train", ("val",), True, False

    def __init__(self, data: str | None = None, limit: int | None = None) -> None:
        self.ready: dict[str, bool] = {}

    def tasks(self, split: str) -> list[Task]:
        return [Task(f"{split}{i}", f"task {split} {i}", i) for i in range(3 if split == "train" else 1)]

    def prepare(self, task: Task, later=lambda: False) -> None:
        self.ready[task.id] = later()

    def run_episode(self, task: Task, memories: list, llm) -> Episode:
        time.sleep(0.2)
        ahead = self.ready.pop(task.id, None)
        return Episode(success=ahead is not None, steps=2 if ahead else 1, trajectory=task.id)

    def close(self) -> None:
        pass


def test_pinned_processes_load_ahead_into_a_larger_batch_after_a_short_one(server, tmp_path):
    """A stream's last batch can have fewer groups than the next stream's first (1 held-out game, then 2
    training games for 2 processes): the process with no game in it loads its next games at once, so every
    episode but the run's first starts from a game loaded for it during the batch before."""
    config = BenchConfig(benchmark=f"{__name__}:Preloading", method="none", epochs=2, batch_size=2,
                         eval_splits=["val"])
    summary = run_benchmark(config, settings(server), runs_dir=str(tmp_path), workers=2)
    episodes = [json.loads(line) for line in (Path(summary["bank"]).parent / "episodes.jsonl").read_text().splitlines()]
    assert all(e["success"] for e in episodes)
    ahead = [(e["task_id"], e["steps"] == 2) for e in episodes]
    assert ahead == [("val0", False), ("train0", True), ("train1", True), ("train2", True), ("val0", True),
                     ("train0", True), ("train1", True), ("train2", True), ("val0", True)]


def test_the_plot_marks_whole_epochs_only():
    pytest.importorskip("matplotlib", reason="the plots extra is not installed: pip install 'memrl[plots]'")
    from memrl_bench.framework.reports import learning_curve_figure

    summary = {"benchmark": "toy", "method": "memrl", "accuracy": {1: 0.2, 2: 0.5}, "csr": {1: 0.2, 2: 0.6}}
    figure = learning_curve_figure([summary])
    figure.canvas.draw()
    axis = figure.axes[0]
    shown = [t for t in axis.get_xticks() if axis.get_xlim()[0] <= t <= axis.get_xlim()[1]]
    assert shown and all(float(t).is_integer() for t in shown), shown  # 1, 2: not 1.0, 1.2, 1.4, ...


def test_a_run_says_what_it_plays_and_where_it_is_before_each_batch(server, tmp_path):
    """The plan (episodes per phase) comes before the first episode; every batch is announced with its phase."""
    from memrl_bench.framework.reports import batch_status, plan_line

    events = []
    config = BenchConfig(benchmark=TOY, epochs=2, batch_size=2, limit=3, eval_splits=["val"], threshold=0.3,
                         options={"rooms": 5})
    summary = run_benchmark(config, settings(server), runs_dir=str(tmp_path), workers=0,
                            on_progress=lambda event, data: events.append((event, data)))
    kinds = [event for event, _ in events]
    assert kinds[0] == "status" and kinds.index("plan") < kinds.index("start") < kinds.index("episode")
    plan = events[kinds.index("plan")][1]
    assert plan_line(plan) == (f"run {summary['run_dir']}: 15 episodes: training 3 per epoch × 2 epochs = 6; "
                               "evaluation 3 per pass (3 of val's 5; --eval-limit all plays every one) × 3 passes "
                               "(before training, after epochs 1, 2) = 9")
    announced = [batch_status(data, "toy") for event, data in events if event == "batch"]
    assert announced[:3] == [("eval val before training, batch 1/2", "playing 2 episodes"),
                             ("eval val before training, batch 2/2", "playing 1 episode"),
                             ("train epoch 1/2, batch 1/2", "playing 2 episodes")]
    assert len(announced) == 2 * 3 + 2 * 2 and kinds[kinds.index("episode") - 1] == "batch"


def test_the_end_line_names_the_run_directory_and_the_plot(server, tmp_path):
    done = subprocess.run([c for c in bench_cmd(server, tmp_path, "--epochs", "1", "--option", "rooms=2") if c != "--json"],
                          env=cli_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    run_dir = next(tmp_path.glob("*/config.json")).parent
    if PLOTS:
        assert done.stdout.splitlines()[-1] == f"done: run directory {run_dir}; plot {run_dir / 'learning_curve.png'}"
    else:
        assert done.stdout.splitlines()[-1] == f"done: run directory {run_dir}; no plot (pip install 'memrl[plots]')"


def run_on_a_terminal(args: list[str], timeout: float = 300) -> tuple[int, str]:
    """Run `args` with stderr on a pseudo-terminal (as in a shell); return the exit code and everything it drew
    there, escape sequences removed and each redraw on a line of its own."""
    import pty
    import re
    import select

    leader, follower = pty.openpty()
    proc = subprocess.Popen(args, env=cli_env() | {"COLUMNS": "200", "TERM": "xterm"}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=follower)
    os.close(follower)
    drawn = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: the process is gone
                break
            if not chunk:
                break
            drawn += chunk
        elif proc.poll() is not None:
            break
    os.close(leader)
    proc.communicate(timeout=60)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", drawn.decode(errors="replace"))
    return proc.returncode, "\n".join(line.strip() for line in re.split(r"[\r\n]", text) if line.strip())


@pytest.mark.slow
def test_progress_shows_totals_and_the_phase_from_the_start(server, tmp_path):
    """On a terminal the bar says what happens from its first frame, shows the total as soon as the run knows
    it, never `0/?`, and names the phase and batch of the episodes in play."""
    code, drawn = run_on_a_terminal([c for c in bench_cmd(server, tmp_path, "--epochs", "2", "--limit", "3", "--eval",
                                                          "val", "--option", "rooms=5", "--option", "delay=0.2")
                                     if c != "--json"])
    assert code == 0, drawn
    lines = drawn.splitlines()
    assert lines[0].startswith("memrl: bank: ")
    label = f"{TOY}/memrl"
    assert lines[1].startswith(f"{label}: "), lines[1]  # the first frame already says what happens
    assert "/?" not in drawn and "0/?" not in drawn
    plan = next(i for i, line in enumerate(lines) if line.startswith("memrl: run "))
    assert all("episodes" not in line for line in lines[:plan])  # no count before the run knows its total
    assert "0/15 episodes" in drawn and "15/15 episodes" in drawn
    for phase in ("eval val before training, batch 1/2", "train epoch 1/2, batch 1/2", "train epoch 2/2, batch 2/2",
                  "eval val after epoch 2, batch 2/2"):
        assert f"{label} · {phase}" in drawn, phase
