"""The authors' protocol by default: configs/NAME.yaml applied without --config, q_min in Phase B,
per-outcome q_init, the embedder of the run's bank, and --limit as a stratified seeded sample."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import bench_data
import conftest
import numpy as np
import pytest
from benchmarks.testing.chat_server import ScriptedChatServer
from benchmarks.testing.toy_benchmark import responder

from memrl_bench.framework import registry
from memrl_bench.framework.config import BenchConfig
from memrl_bench.framework.harness import run_benchmark
from memrl_bench.framework.sampling import stratified_sample
from memrl_bench.framework.protocol import Task
from memrl_bench.framework.session import default_config, read_config
from memrl_cli.bank import MemoryBank
from memrl_cli.errors import MemrlError
from memrl_bench.framework.llm import LLMSettings
from memrl_cli.method.retrieval import Candidate, RetrieveParams, phase_b, zscores

TOY = "benchmarks.testing.toy_benchmark:Passcodes"
TESTS = Path(__file__).parent
ROOT = TESTS.parent
BCB_DATA = bench_data.directory("bigcodebench", "bigcodebench_full.jsonl")


@pytest.fixture(scope="module")
def server():
    with ScriptedChatServer(responder) as s:
        yield s


def settings(server: ScriptedChatServer) -> LLMSettings:
    return LLMSettings(model="scripted", base_url=server.base_url, api_key="sk-test")


# -- q_min ----------------------------------------------------------------------------

def test_q_min_filters_phase_b_with_statistics_over_all_candidates():
    qs = [-0.9, 0.5, 0.0, -0.85, 0.2]
    def candidates():
        return [Candidate(i, 0.8 - 0.01 * i, q) for i, q in enumerate(qs)]
    plain, filtered = candidates(), candidates()
    phase_b(plain, RetrieveParams(k2=5), (0.5, 0.1), random.Random(0))
    phase_b(filtered, RetrieveParams(k2=5, q_min=-0.8), (0.5, 0.1), random.Random(0))
    assert sorted(c.memory_id for c in plain if c.selected_rank is not None) == [0, 1, 2, 3, 4]
    assert sorted(c.memory_id for c in filtered if c.selected_rank is not None) == [1, 2, 4]
    expected = zscores(np.array(qs), clip=3.0)  # the filter comes after the statistics, as in the authors' code
    assert [c.z_q for c in filtered] == pytest.approx(expected.tolist())
    explored = candidates()  # ε = 1: a random subset, of the eligible candidates only
    assert phase_b(explored, RetrieveParams(k2=2, epsilon=1.0, q_min=0.0), (0.5, 0.1), random.Random(3))
    assert {c.memory_id for c in explored if c.selected_rank is not None} <= {1, 2, 4}
    nothing = candidates()
    assert not phase_b(nothing, RetrieveParams(q_min=0.9), (0.5, 0.1), random.Random(0))
    assert all(c.selected_rank is None for c in nothing)
    with pytest.raises(MemrlError, match="q_min"):
        RetrieveParams(q_min=float("nan"))


def test_bank_retrieve_hides_memories_below_q_min(tmp_path):
    with MemoryBank(str(tmp_path / "bank.db")) as bank:
        low = bank.ingest("open the red door", "keep left", outcome="failure", q=-0.9).id
        high = bank.ingest("open the red door quickly", "keep right", outcome="success", q=0.4).id
        everything = bank.retrieve("open the red door", RetrieveParams(k1=5, k2=5, threshold=0.0))
        assert {m["id"] for m in everything.memories} == {low, high}
        kept = bank.retrieve("open the red door", RetrieveParams(k1=5, k2=5, threshold=0.0, q_min=-0.8))
        assert [m["id"] for m in kept.memories] == [high]
        assert {c.memory_id for c in kept.candidates} == {low, high}  # the receipt still shows both
    done = conftest.run_memrl("retrieve", "open the red door", "--threshold", "0", "--q-min", "-0.8", "--json",
                              "--db", str(tmp_path / "bank.db"), ok=False)
    assert done.returncode == 0, done.stderr
    assert [m["id"] for m in json.loads(done.stdout)["memories"]] == [high]


# -- per-outcome q_init, q_min and sim stats through the harness ------------------------

def test_q_init_by_outcome_q_min_and_sim_stats_reach_the_bank(server, tmp_path):
    config = BenchConfig(benchmark=TOY, epochs=2, batch_size=3, threshold=0.3, q_min=-0.8, sim_mean=0.31,
                         sim_std=0.1, q_init={"success": 1.0, "failure": -0.5}, options={"rooms": 3})
    summary = run_benchmark(config, settings(server), runs_dir=str(tmp_path), workers=0)
    assert summary["accuracy"] == {1: 0.0, 2: 1.0}
    records = [json.loads(line) for line in (Path(summary["bank"]).parent / "episodes.jsonl").read_text().splitlines()]
    with MemoryBank(summary["bank"], create=False) as bank:
        q = dict(bank.conn.execute("SELECT id, q FROM memories").fetchall())
        # epoch 2's scripts were never rewarded: they keep the success value; epoch 1's reflections
        # started at the failure value and moved toward +1 once per success they were injected into
        assert {q[r["new_memory_id"]] for r in records if r["epoch"] == 2} == {1.0}
        for r in records:
            if r["epoch"] == 1:
                n = sum(r["new_memory_id"] in later["memory_ids"] for later in records if later["epoch"] == 2)
                assert n >= 1 and q[r["new_memory_id"]] == pytest.approx(1 - 1.5 * 0.7 ** n)
        params = [json.loads(p) for (p,) in bank.conn.execute("SELECT params FROM retrievals")]
        assert {(p["q_min"], p["sim_mean"], p["sim_std"]) for p in params} == {(-0.8, 0.31, 0.1)}
        assert {tuple(r) for r in bank.conn.execute("SELECT sim_mean, sim_std FROM retrievals")} == {(0.31, 0.1)}
    stored = json.loads((Path(summary["bank"]).parent / "config.json").read_text())["config"]
    assert stored["q_init"] == {"success": 1.0, "failure": -0.5} and stored["q_min"] == -0.8
    with pytest.raises(MemrlError, match="q_init must be a number or"):
        BenchConfig(benchmark=TOY, q_init={"success": 1.0})


def test_embedder_names_the_bank_model(server, tmp_path, monkeypatch):
    monkeypatch.setenv("MEMRL_EMBED_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    before = len(server.embedding_requests)
    config = BenchConfig(benchmark=TOY, epochs=1, batch_size=2, embedder="openai:text-embedding-3-large",
                         options={"rooms": 2})
    summary = run_benchmark(config, settings(server), runs_dir=str(tmp_path), workers=0)
    with MemoryBank(summary["bank"], create=False) as bank:
        assert bank.embedder.spec == "openai:text-embedding-3-large"
    sent = server.embedding_requests[before:]
    assert sent and {r["model"] for r in sent} == {"text-embedding-3-large"}


# -- --limit: stratified, seeded --------------------------------------------------------

def typed_tasks() -> list[Task]:
    """200 `put` first (as ALFWorld's training games sorted by id), then five smaller types."""
    sizes = {"put": 200, "clean": 40, "heat": 30, "cool": 25, "examine": 20, "puttwo": 5}
    return [Task(f"{kind}/{i}", f"{kind} task {i}", meta={"task_type": kind})
            for kind, n in sizes.items() for i in range(n)]


def test_limit_is_a_seeded_sample_stratified_by_task_type():
    tasks = typed_tasks()
    sample = stratified_sample(tasks, 60, 0, "train")
    assert len(sample) == 60 and len({t.id for t in sample}) == 60
    counts = {k: sum(t.meta["task_type"] == k for t in sample) for k in ("put", "clean", "heat", "cool", "examine",
                                                                         "puttwo")}
    assert min(counts.values()) >= 1 and counts["put"] == max(counts.values())
    assert sum(counts.values()) == 60 and counts["put"] < 60 * 0.6
    assert [tasks.index(t) for t in sample] == sorted(tasks.index(t) for t in sample)  # stream order kept
    assert stratified_sample(tasks, 60, 0, "train") == sample
    assert stratified_sample(tasks, 60, 1, "train") != sample
    assert len({t.meta["task_type"] for t in stratified_sample(tasks, 4, 0, "train")}) == 4
    assert stratified_sample(tasks, None, 0, "train") == tasks == stratified_sample(tasks, 999, 0, "train")
    untyped = [Task(str(i), str(i)) for i in range(10)]
    assert len(stratified_sample(untyped, 3, 0, "train")) == 3


# -- the authors' config by default --------------------------------------------------------

def test_every_config_is_valid_and_found_by_name():
    for name in ("alfworld", "bigcodebench", "hle", "llb-db", "llb-os"):
        path = default_config(name)
        assert path is not None and Path(path) == ROOT / "configs" / f"{name}.yaml"
        values = read_config(path)
        BenchConfig(benchmark=name, **values)  # every key is a valid setting
    assert default_config(TOY) is None and default_config("no-such-bench") is None
    bcb = read_config(default_config("bigcodebench"))
    assert (bcb["k2"], bcb["epsilon"], bcb["q_min"], bcb["batch_size"]) == (5, 0.1, -0.8, 25)
    hle = read_config(default_config("hle"))
    assert hle["q_init"] == {"success": 1.0, "failure": 0.0}
    assert hle["options"]["judge_model"] == "gpt-4o-2024-08-06"
    llb = read_config(default_config("llb-db"))
    assert {k: llb[k] for k in ("epochs", "batch_size", "k1", "k2", "epsilon", "failure_reward", "q_floor",
                                "q_init")} == {"epochs": 20, "batch_size": 5, "k1": 10, "k2": 5, "epsilon": 0.01,
                                               "failure_reward": 0.0, "q_floor": 0.0, "q_init": 0.5}
    assert read_config(default_config("alfworld"))["eval_splits"] == ["valid_seen"]


@bench_data.needs("bigcodebench", BCB_DATA / "split_full_seed123.json")
@pytest.mark.slow
def test_bench_bigcodebench_without_config_runs_the_authors_protocol(tmp_path):
    def reply(request: dict) -> str:
        return "```python\ndef task_func(*args, **kwargs):\n    return None\n```"

    try:
        registry.require_extra("bigcodebench")
    except MemrlError as exc:
        pytest.skip(str(exc))
    with ScriptedChatServer(reply) as chat:
        result = conftest.run_memrl("bench", "bigcodebench", "--data", str(BCB_DATA), "--limit", "2", "--epochs", "1",
                                    "--workers", "0", "--option", "sandbox=none", "--base-url", chat.base_url,
                                    "--model", "scripted", "--runs-dir", str(tmp_path), "--json",
                                    env={"OPENAI_API_KEY": "sk-test"}, ok=False, timeout=300)
        assert result.returncode == 0, result.stderr
        assert {r.get("max_tokens") for r in chat.requests} == {12800}  # the config's llm: section, every call
    summary = json.loads(result.stdout)
    stored = json.loads((Path(summary["bank"]).parent / "config.json").read_text())
    config = stored["config"]
    assert config["config_file"] == str(ROOT / "configs" / "bigcodebench.yaml")
    assert (config["k1"], config["k2"], config["epsilon"], config["q_min"], config["batch_size"]) == (5, 5, 0.1, -0.8, 25)
    assert (config["epochs"], config["limit"]) == (1, 2)  # flags override the file
    assert stored["llm"]["max_tokens"] == 12800 and stored["llm"]["temperature"] is None
    split = json.loads((BCB_DATA / "split_full_seed123.json").read_text())
    episodes = [json.loads(line) for line in (Path(summary["bank"]).parent / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 2 and {e["task_id"] for e in episodes} <= set(split["train_ids"])


# -- a new benchmark is one module plus one entry point (docs/bench.md) -----------------------

def test_the_documented_benchmark_is_one_module_plus_one_entry_point(tmp_path, monkeypatch):
    """docs/bench.md's example module and entry-point line, installed as pip would (a module and a
    dist-info on the path): `memrl bench sums` finds it by name and plays it."""
    doc = (ROOT / "docs" / "bench.md").read_text(encoding="utf-8").split("## Adding a benchmark", 1)[1]
    module = doc.split("```python\n", 1)[1].split("```", 1)[0]
    entry = doc.split("```toml\n", 1)[1].split("```", 1)[0].splitlines()
    assert entry[0] == '[project.entry-points."memrl.benchmarks"]' and len(entry) == 2, entry
    name, target = (part.strip().strip('"') for part in entry[1].split("=", 1))
    (tmp_path / f"{target.split(':')[0]}.py").write_text(module, encoding="utf-8")
    info = tmp_path / "memrl_sums_example-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: memrl-sums-example\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[memrl.benchmarks]\n{name} = {target}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, target.split(":")[0], raising=False)

    assert name in registry.available()
    with pytest.raises(MemrlError, match="has no option rooms; its options: count"):
        registry.create(name, None, None, {"rooms": 3})

    def answer(request):
        system, query = request["messages"][0]["content"], request["messages"][-1]["content"]
        if system.startswith("Answer with the number only."):
            a, b = map(int, query.removeprefix("What is ").removesuffix("?").split(" + "))
            return str(a + b)
        return "Add the two numbers and answer with the sum alone."

    with ScriptedChatServer(answer) as sums_server:
        config = BenchConfig(benchmark=name, epochs=2, batch_size=4, eval_splits=["test"], options={"count": 4})
        summary = run_benchmark(config, settings(sums_server), runs_dir=str(tmp_path / "runs"), workers=0)
    assert summary["accuracy"] == {1: 1.0, 2: 1.0}
    with MemoryBank(summary["bank"], create=False) as bank:
        # one memory per episode (the paper): epoch 2 replays epoch 1's episodes, each a memory of its own
        assert bank.conn.execute("SELECT count(*) FROM memories").fetchone()[0] == 8
    assert sys.modules[target.split(":")[0]].__file__ == str(tmp_path / "my_bench.py")
