"""One run of the synthetic testbed through the real harness, for a method, a judge or the contestant `learned`.

`play` builds the run's settings (the testbed's, the method's, the judge's or `learned`'s, the scenario's and the
seed's: the seed seeds the harness and the agent's luck), plants `p`'s records through the harness's
progress callback, and returns the run's summary (`run_benchmark`'s) with its bank's path.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import yaml

from benchmarks.learning.learned import LEARNED, POOL
from benchmarks.learning.oracle import JUDGES, judge_settings
from benchmarks.learning.synthetic import planter
from memrl_bench.framework.config import BenchConfig
from memrl_bench.framework.harness import run_benchmark
from memrl_bench.framework.llm import LLMSettings

ADAPTER = "benchmarks.learning.synthetic:Synthetic"
NO_LLM = LLMSettings(model="none", base_url="http://127.0.0.1:9/v1", api_key="none")  # never called
TESTBED = {"epochs": 6, "batch_size": 8, "k1": 5, "k2": 3, "threshold": 0.3}  # the settings of every round


def variant(method: str) -> tuple[str, dict[str, Any]]:
    """A contestant's method and settings: `memrl`, or `memrl+recall=groups+sim_stats=bank` (values as YAML)."""
    name, *switches = method.split("+")
    settings = {key: yaml.safe_load(value) for key, _, value in (s.partition("=") for s in switches)}
    return name, settings


def config_for(scenario: str, method: str, seed: int, testbed: dict[str, Any] | None = None,
               heldout: bool = False, luck: str = "attempt") -> BenchConfig:
    """The settings of one run: the testbed's, then the method's switches or the judge's candidate list."""
    t = {**TESTBED, **(testbed or {})}
    name, switches = variant(method)
    options: dict[str, Any] = {"scenario": scenario, "luck_seed": seed, "luck": luck}
    settings: dict[str, Any] = {"method": name, "k1": t["k1"], "k2": t["k2"], "threshold": t["threshold"]}
    if name in JUDGES:
        judged, chosen = judge_settings(name, t["k1"], t["k2"], t["threshold"])
        settings.update(judged)
        options.update(chosen)
    elif name == LEARNED:  # rag's wider recall, of which the selector shows at most k2
        settings.update(method="rag", k1=POOL, k2=POOL)
        options.update(chooser=LEARNED, show=t["k2"], batch_size=t["batch_size"])
    settings.update(switches)
    extra: dict[str, Any] = {"eval_splits": ["heldout"], "eval_every": t["epochs"]} if heldout else {}
    return BenchConfig(benchmark=ADAPTER, epochs=t["epochs"], batch_size=t["batch_size"], seed=seed,
                       options=options, **settings, **extra)


def play(scenario: str, method: str, seed: int, runs_dir: str, testbed: dict[str, Any] | None = None,
         heldout: bool = False, luck: str = "attempt") -> dict[str, Any]:
    """One run through `run_benchmark` (its summary), with `p`'s records planted as the run goes."""
    config = config_for(scenario, method, seed, testbed, heldout, luck)
    bank_path = Path(runs_dir) / f"bank-{scenario}-{seed}-{uuid.uuid4().hex[:12]}.db"  # outside the run dir: named first
    Path(runs_dir).mkdir(parents=True, exist_ok=True)
    summary = run_benchmark(config, NO_LLM, runs_dir=runs_dir, workers=0, bank_path=str(bank_path),
                            on_progress=planter(scenario, str(bank_path), config.initial_q(True)))
    summary["judge"] = variant(method)[0] in (*JUDGES, LEARNED)  # not methods: no receipts of what they showed
    return summary
