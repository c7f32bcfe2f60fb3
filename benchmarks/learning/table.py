"""Methods × scenarios on the synthetic testbed, through the real harness.

    python -m benchmarks.learning.table [--epochs 6] [--seeds 0,1,2] [--methods memrl,rag,...]
        [--scenarios a,b,c,d,e] [--out DIR]

Prints, per scenario and method, last-epoch accuracy and CSR (mean over seeds) and, from the
receipts of the last epoch, how often a useful memory existed in the bank, was recalled
(Phase A) and was selected (Phase B).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from statistics import mean
from typing import Any

from benchmarks.harness import METHODS, BenchConfig, run_benchmark
from benchmarks.learning.synthetic import SCENARIOS, Synthetic, utility
from memrl_cli.bank import MemoryBank
from memrl_cli.llm import LLMSettings

ADAPTER = "benchmarks.learning.synthetic:Synthetic"
NO_LLM = LLMSettings(model="none", base_url="http://127.0.0.1:9/v1", api_key="none")  # never called


def run(scenario: str, method: str, seed: int, epochs: int, runs_dir: str, k2: int = 3) -> dict[str, Any]:
    """One run through `run_benchmark`; its summary plus the useful-memory rates of its last epoch."""
    config = BenchConfig(benchmark=ADAPTER, method=method, epochs=epochs, batch_size=8, k2=k2, threshold=0.3,
                         seed=seed, options={"scenario": scenario, "luck_seed": seed})
    summary = run_benchmark(config, NO_LLM, runs_dir=runs_dir, workers=0)
    summary["rates"] = useful_rates(Path(runs_dir) / summary["run_id"], summary["run_id"], scenario, epochs)
    return summary


def useful_rates(run_dir: Path, run_id: str, scenario: str, epoch: int) -> dict[str, float]:
    """Share of `epoch`'s episodes where a useful memory existed, was recalled, was selected (from receipts)."""
    adapter = Synthetic(scenario=scenario)
    tasks = {t.id: t for t in adapter.tasks("train")}
    with MemoryBank(str(run_dir / "bank.db"), index="numpy") as bank:
        texts = dict(bank.conn.execute("SELECT id, experience FROM memories").fetchall())
        episodes = bank.conn.execute("SELECT task_id, epoch, batch, retrieval_id, new_memory_id FROM episodes "
                                     "WHERE run_id = ? AND phase = 'train'", (run_id,)).fetchall()
        born = {new: (e, b) for _, e, b, _, new in episodes if new is not None}
        counts = {"existed": 0, "recalled": 0, "selected": 0}
        last = [row for row in episodes if row[1] == epoch]
        for task_id, e, b, rid, _ in last:
            useful = {m for m, text in texts.items() if born.get(m, (0, 0)) < (e, b)
                      and utility(scenario, tasks[task_id], text) == 1}
            if not useful:
                continue
            counts["existed"] += 1
            if rid is None:
                continue
            rows = bank.conn.execute("SELECT memory_id, selected_rank FROM retrieval_candidates WHERE retrieval_id = ?",
                                     (rid,)).fetchall()
            counts["recalled"] += any(m in useful for m, _ in rows)
            counts["selected"] += any(m in useful and rank is not None for m, rank in rows)
    return {k: v / max(len(last), 1) for k, v in counts.items()}


def table(methods: list[str], scenarios: list[str], seeds: list[int], epochs: int, runs_dir: str) -> list[dict[str, Any]]:
    """One row per (scenario, method): means over seeds."""
    rows = []
    for scenario in scenarios:
        for method in methods:
            results = [run(scenario, method, seed, epochs, runs_dir) for seed in seeds]
            rows.append({"scenario": scenario, "method": method,
                         "accuracy": mean(r["accuracy"][epochs] for r in results),
                         "csr": mean(r["csr"][epochs] for r in results),
                         **{k: mean(r["rates"][k] for r in results) for k in ("existed", "recalled", "selected")}})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--methods", default=",".join(m for m in METHODS if m != "self-rag"))  # needs an LLM
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--out", default=None, help="Keep the runs here (default: a temporary directory).")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        rows = table(args.methods.split(","), args.scenarios.split(","), seeds, args.epochs, args.out or tmp)
    print(f"last epoch ({args.epochs}), mean over seeds {seeds}")
    print("| scenario | method | accuracy | CSR | useful existed | recalled | selected |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['scenario']} | {r['method']} | {r['accuracy']:.3f} | {r['csr']:.3f} | {r['existed']:.2f} | "
              f"{r['recalled']:.2f} | {r['selected']:.2f} |")


if __name__ == "__main__":
    main()
