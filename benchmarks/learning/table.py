"""Methods × scenarios on the synthetic testbed, through the real harness.

    python -m benchmarks.learning.table [--epochs 6] [--seeds 0-9] [--methods memrl,rag,...]
        [--scenarios a,b,c,d,e] [--margin 0.05] [--out DIR] [--json] [--save FILE]

Prints, per scenario and method, last-epoch accuracy (mean over seeds ± its standard error), its
paired difference with `memrl` and with `rag` on the same seeds (mean ± standard error), CSR and,
from the receipts of the last epoch, how often a useful memory existed in the bank, was recalled
(Phase A) and was selected (Phase B). Each seed seeds the harness and the agent's luck. The methods
may include the judges of benchmarks/learning/oracle.py (`oracle`, `oracle-recall`: the ceilings, which
read the true utility; `no-failures`, `newest`: two fixed rules): measurement devices, not methods.
With `--margin M` it also prints, for every
method paired with `memrl` or `rag`, whether it is non-inferior on each scenario: the lower end of
its paired difference's confidence interval (mean − 2 standard errors, about 95%) above −M.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path
from statistics import mean, stdev
from typing import Any

from benchmarks.learning.play import ADAPTER, NO_LLM, play
from benchmarks.learning.synthetic import SCENARIOS, Synthetic, utility, world
from memrl_bench.framework.config import METHODS
from memrl_cli.bank import MemoryBank

__all__ = ["ADAPTER", "NO_LLM", "run", "table"]


def run(scenario: str, method: str, seed: int, epochs: int, runs_dir: str, k2: int = 3) -> dict[str, Any]:
    """One run through `run_benchmark` (`play.play`); its summary plus the useful-memory rates of its last epoch.

    The judges (`oracle`, `oracle-recall`, `no-failures`, `newest`: benchmarks/learning/oracle.py) are
    measurement devices, not methods; their rates are not counted (their receipts list every candidate)."""
    summary = play(scenario, method, seed, runs_dir, {"epochs": epochs, "k2": k2})
    summary["rates"] = dict.fromkeys(("existed", "recalled", "selected"), math.nan) if summary["judge"] else \
        useful_rates(Path(summary["bank"]), summary["run_id"], scenario, epochs)
    return summary


def useful_rates(bank_path: Path, run_id: str, scenario: str, epoch: int) -> dict[str, float]:
    """Share of `epoch`'s episodes where a useful memory existed, was recalled, was selected (from receipts)."""
    adapter = Synthetic(scenario=scenario)
    tasks = {t.id: t for t in adapter.tasks("train")}
    now = world(scenario, epoch)
    with MemoryBank(str(bank_path), index="numpy") as bank:
        texts = bank.store.experiences()
        episodes = bank.store.training_episodes(run_id)
        born = {new: (e, b) for _, e, b, _, new in episodes if new is not None}
        counts = {"existed": 0, "recalled": 0, "selected": 0}
        last = [row for row in episodes if row[1] == epoch]
        for task_id, e, b, rid, _ in last:
            useful = {m for m, text in texts.items() if born.get(m, (0, 0)) < (e, b)
                      and utility(scenario, tasks[task_id], text, now) == 1}
            if not useful:
                continue
            counts["existed"] += 1
            if rid is None:
                continue
            rows = bank.store.receipt_selection(rid)
            counts["recalled"] += any(m in useful for m, _ in rows)
            counts["selected"] += any(m in useful and rank is not None for m, rank in rows)
    return {k: v / max(len(last), 1) for k, v in counts.items()}


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and its standard error (0 with one value). The mean is rounded to 12 decimals: accuracies
    are counts of episodes over a few hundred, so float noise (a tie printed as -0.000) is no difference."""
    return round(mean(values), 12) + 0.0, (stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0)


LOWER_BOUND_SES = 2.0  # mean − 2 SE: the lower end of a ~95% interval (Student's t at 59 df is 2.001)


def lower_bound(pair: tuple[float, float]) -> float:
    """Lower end of a paired difference's ~95% confidence interval: mean − 2 standard errors."""
    return pair[0] - LOWER_BOUND_SES * pair[1]


def non_inferiority(row: dict[str, Any], margin: float) -> dict[str, dict[str, Any]]:
    """Per reference the row was paired with (`memrl`, `rag`): the lower bound of the difference and
    whether it lies above −`margin` (the row's method is then no worse than the reference by `margin`)."""
    bounds = {ref: lower_bound(row[f"vs_{ref}"]) for ref in ("memrl", "rag") if f"vs_{ref}" in row}
    return {ref: {"lower_bound": bound, "holds": bound > -margin} for ref, bound in bounds.items()}


def parse_seeds(text: str) -> list[int]:
    """Seeds as `0,1,2`, `0-9` or a mix (`0-3,10`)."""
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds.extend(range(int(low), int(high) + 1) if high else [int(low)])
    return seeds


def table(methods: list[str], scenarios: list[str], seeds: list[int], epochs: int, runs_dir: str) -> list[dict[str, Any]]:
    """One row per (scenario, method): last-epoch accuracy per seed, means over seeds, standard errors,
    and the paired differences with `memrl` and `rag` on the same seeds (when they are in `methods`)."""
    rows = []
    for scenario in scenarios:
        per_method: dict[str, list[dict[str, Any]]] = {
            method: [run(scenario, method, seed, epochs, runs_dir) for seed in seeds] for method in methods}
        accuracy = {m: [r["accuracy"][epochs] for r in results] for m, results in per_method.items()}
        for method, results in per_method.items():
            row: dict[str, Any] = {"scenario": scenario, "method": method, "seeds": seeds,
                                   "per_seed": accuracy[method]}
            row["accuracy"], row["se"] = mean_se(accuracy[method])
            for ref in ("memrl", "rag"):
                if ref in accuracy and ref != method:
                    row[f"vs_{ref}"] = mean_se([a - b for a, b in zip(accuracy[method], accuracy[ref])])
            row["csr"] = mean(r["csr"][epochs] for r in results)
            row.update({k: mean(r["rates"][k] for r in results) for k in ("existed", "recalled", "selected")})
            rows.append(row)
    return rows


def _pm(pair: tuple[float, float] | None) -> str:
    return "" if pair is None else f"{pair[0]:+.3f} ± {pair[1]:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--seeds", default="0-9", help="e.g. 0-9 or 0,1,2 [0-9]")
    parser.add_argument("--methods", default=",".join(m for m in METHODS if m != "self-rag"))  # needs an LLM
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--margin", type=float, default=None,
                        help="Also test non-inferiority to memrl and rag with this margin (e.g. 0.05).")
    parser.add_argument("--out", default=None, help="Keep the runs here (default: a temporary directory).")
    parser.add_argument("--json", action="store_true", help="Print the rows as JSON.")
    parser.add_argument("--save", default=None, help="Also write the rows as JSON to this file.")
    args = parser.parse_args()
    seeds = parse_seeds(args.seeds)
    with tempfile.TemporaryDirectory() as tmp:
        rows = table(args.methods.split(","), args.scenarios.split(","), seeds, args.epochs, args.out or tmp)
    if args.margin is not None:
        for r in rows:
            r["non_inferior"] = non_inferiority(r, args.margin)
    if args.save:
        Path(args.save).write_text(json.dumps(rows, indent=1))
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"last epoch ({args.epochs}), mean ± standard error over {len(seeds)} seeds {args.seeds}")
    print("| scenario | method | accuracy | vs memrl (paired) | vs rag (paired) | CSR | useful existed | recalled "
          "| selected |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['scenario']} | {r['method']} | {r['accuracy']:.3f} ± {r['se']:.3f} | {_pm(r.get('vs_memrl'))} | "
              f"{_pm(r.get('vs_rag'))} | {r['csr']:.3f} | {r['existed']:.2f} | {r['recalled']:.2f} | "
              f"{r['selected']:.2f} |")
    if args.margin is not None:
        print(f"\nnon-inferiority, margin {args.margin}: lower bound (mean − 2 SE) of the paired difference > −margin")
        for r in rows:
            for ref, v in r["non_inferior"].items():
                print(f"- {r['scenario']} {r['method']} vs {ref}: {v['lower_bound']:+.3f} "
                      f"{'holds' if v['holds'] else 'FAILS'}")


if __name__ == "__main__":
    main()
