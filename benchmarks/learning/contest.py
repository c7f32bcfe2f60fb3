"""A declared contest of methods × seeds on the synthetic testbed or real ALFWorld games, judged by rules fixed
before it runs.

    python -m benchmarks.learning.contest benchmarks/learning/contests/contest1.yaml [--seeds 30000-30001]
        [--out DIR [--resume]] [--save results.json] [--plot curves.png] [--jobs 2]

The declaration (YAML) fixes everything that decides the verdict before any run: the testbed's
scenarios and settings, the methods, the fresh seeds, the endpoints, the interval's confidence and
the decision rules with their margins. The runner plays every (scenario, method, seed) through the real
harness (`run_benchmark`: the same retrieval, tie rule, rewards, receipts and resume as `memrl bench`)
with luck drawn per attempt (the same draws for every method), evaluates the held-out split before
training and after the last epoch (the paper's transfer setting), then prints per epoch each method's
mean accuracy ± its 95% interval over seeds, the paired differences of the declared comparisons with
their intervals, the held-out accuracies, each scenario's last-epoch accuracy and area under the learning
curve (AUC: the mean accuracy over the epochs), and the verdicts the declared rules give. A declaration's
`room` names a reference and ceilings (the judges of benchmarks/learning/oracle.py): the report then says,
per scenario, whether each ceiling leaves room above the reference, and averages the room over the
scenarios that have some only. `--plot` draws the learning curves with their bands in one PNG. `--seeds`
overrides the declared seeds (for a smoke run; a result is the declaration's only with its own seeds).
A testbed of `kind: alfworld` plays real ALFWorld games with the scripted agent instead (its scenarios are the
agent's modes, `alfworld_scripted.contest_run`), without a held-out split.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from statistics import mean, stdev
from typing import Any

import yaml

from benchmarks.learning.oracle import WHOLE_BANK as JUDGE_WHOLE_BANK
from benchmarks.learning.play import ADAPTER, play
from benchmarks.learning.table import parse_seeds
from memrl_bench.framework.config import HARNESS_DEPARTURES, RECALL_SWITCHES, BenchConfig

SWITCHES = [*RECALL_SWITCHES, *HARNESS_DEPARTURES]  # a run's departure switches (the selector goes with its method)
OFF = {k: getattr(BenchConfig(benchmark=ADAPTER), k) for k in SWITCHES}  # each one's value when off: the defaults
T_QUANTILES = {  # Student's t for a two-sided interval of this confidence, by degrees of freedom (standard tables)
    0.95: {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
           11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
           20: 2.086, 24: 2.064, 29: 2.045, 39: 2.023, 59: 2.001},
    0.975: {1: 25.452, 2: 6.205, 3: 4.177, 4: 3.495, 5: 3.163, 6: 2.969, 7: 2.841, 8: 2.752, 9: 2.685, 10: 2.634,
            11: 2.593, 12: 2.560, 13: 2.533, 14: 2.510, 15: 2.490, 16: 2.473, 17: 2.458, 18: 2.445, 19: 2.433,
            20: 2.423, 24: 2.391, 29: 2.364, 39: 2.331, 59: 2.301},
}


def t_quantile(df: int, confidence: float = 0.95) -> float:
    """Student's t quantile for a two-sided interval (the table's largest df not above `df`: conservative)."""
    if confidence not in T_QUANTILES:
        raise SystemExit(f"a {confidence} interval is not tabled; use one of {', '.join(map(str, T_QUANTILES))}")
    table = T_QUANTILES[confidence]
    return table[max(k for k in table if k <= df)]


def interval(values: list[float | None], confidence: float = 0.95) -> dict[str, Any]:
    """Mean and its two-sided t interval over `values` (seeds); all None if an endpoint was not measured."""
    if not values or None in values:  # an endpoint the testbed does not measure (ALFWorld's held-out)
        return {"mean": None, "low": None, "high": None, "n": 0}
    m = mean(values)
    if len(values) < 2:
        return {"mean": m, "low": m, "high": m, "n": len(values)}
    half = t_quantile(len(values) - 1, confidence) * stdev(values) / math.sqrt(len(values))
    return {"mean": m, "low": m - half, "high": m + half, "n": len(values)}


def run_one(scenario: str, method: str, seed: int, testbed: dict[str, Any], runs_dir: str) -> dict[str, Any]:
    """One run through the harness (`play.play`): training accuracy per epoch and held-out accuracy before and
    after. `method` may be a judge of benchmarks/learning/oracle.py (a ceiling or a fixed rule). A testbed of
    `kind: alfworld` plays real ALFWorld games with the scripted agent instead, its scenarios the agent's modes
    (`alfworld_scripted.contest_run`: no held-out split)."""
    if testbed.get("kind") == "alfworld":
        from benchmarks.learning.alfworld_scripted import contest_run

        return contest_run(scenario, method, seed, testbed, runs_dir)
    summary = play(scenario, method, seed, runs_dir, testbed, heldout=True)
    heldout = summary["eval_accuracy"].get("heldout", {})
    return {"scenario": scenario, "method": method, "seed": seed,
            "accuracy": [summary["accuracy"][e] for e in range(1, testbed["epochs"] + 1)],
            "csr": summary["csr"][testbed["epochs"]],
            "heldout_before": heldout.get(0), "heldout_after": heldout.get(testbed["epochs"])}


def results_of(runs_dir: str | Path, epochs: int) -> list[dict[str, Any]]:
    """The raw results of finished runs in `runs_dir` (each run directory's config.json and summary.json), as
    `run_one` returns them: a contest whose report failed is reported again without playing it again."""
    rows = []
    for summary_path in sorted(Path(runs_dir).glob("*/summary.json")):
        config = json.loads((summary_path.parent / "config.json").read_text())["config"]
        summary = json.loads(summary_path.read_text())
        heldout = summary["eval_accuracy"].get("heldout", {})
        switches = "".join(f"+{k}={v if isinstance(v, str) else json.dumps(v)}" for k in SWITCHES
                           if (v := config.get(k, OFF[k])) != OFF[k])  # as the declaration names them
        chooser = config["options"].get("chooser")
        judge = None if chooser is None else "oracle-recall" if chooser == "oracle" and config["k1"] == config["k2"] \
            and config["k1"] < JUDGE_WHOLE_BANK else chooser
        options = config["options"]
        rows.append({"scenario": options.get("scenario", options.get("mode", "plain")),  # ALFWorld's: the mode
                     "method": judge or config["method"] + switches,
                     "seed": config["seed"],
                     "accuracy": [summary["accuracy"][str(e)] for e in range(1, epochs + 1)],
                     "csr": summary["csr"][str(epochs)],
                     "heldout_before": heldout.get("0"), "heldout_after": heldout.get(str(epochs))})
    return rows


def _run_job(job: tuple[str, str, int, dict[str, Any], str]) -> dict[str, Any]:
    return run_one(*job)


def run_all(declaration: dict[str, Any], seeds: list[int], runs_dir: str, jobs: int = 1,
            done: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Every (scenario, method, seed) of the declaration but those `done` (rows of runs already finished, kept);
    the raw results, one row per run."""
    finished = {(r["scenario"], r["method"], r["seed"]) for r in done}
    work = [(s, m, seed, declaration["testbed"], runs_dir) for s in declaration["scenarios"]
            for m in declaration["methods"] for seed in seeds if (s, m, seed) not in finished]
    if jobs <= 1:
        return [*done, *(_run_job(w) for w in work)]
    with ProcessPoolExecutor(jobs) as pool:
        return [*done, *pool.map(_run_job, work)]


ENDPOINTS = {  # a run's value of each endpoint
    "last_epoch": lambda r: r["accuracy"][-1],
    "auc": lambda r: mean(r["accuracy"]),  # the area under the learning curve, per epoch: the mean over epochs
    "heldout": lambda r: r["heldout_after"],
    "csr": lambda r: r["csr"],
}


def per_seed(results: list[dict[str, Any]], method: str, endpoint: str, scenarios: list[str]) -> dict[int, float]:
    """A method's value of `endpoint` per seed, averaged over `scenarios` (`ENDPOINTS`)."""
    key = ENDPOINTS[endpoint]
    by_seed: dict[int, list[float]] = {}
    for r in results:
        if r["method"] == method and r["scenario"] in scenarios and key(r) is not None:
            by_seed.setdefault(r["seed"], []).append(key(r))
    return {seed: mean(v) for seed, v in by_seed.items()}


def paired(results: list[dict[str, Any]], a: str, b: str, endpoint: str, scenarios: list[str],
           confidence: float) -> dict[str, float]:
    """The interval of a − b over seeds, each seed's values averaged over `scenarios`."""
    va, vb = per_seed(results, a, endpoint, scenarios), per_seed(results, b, endpoint, scenarios)
    return interval([va[s] - vb[s] for s in sorted(va) if s in vb], confidence)


def verdict(rule: dict[str, Any], results: list[dict[str, Any]], scenarios: list[str]) -> dict[str, Any]:
    """A declared rule applied: `better` (every comparison's interval above `margin`), `level` (every one
    inside ±`equivalence`), else what the intervals say."""
    confidence = rule.get("confidence", 0.95)
    comparisons = {f"{a} - {b}": paired(results, a, b, rule["endpoint"], scenarios, confidence)
                   for a, b in rule["comparisons"]}
    margin, equivalence = rule.get("margin", 0.0), rule.get("equivalence")
    if all(c["low"] > margin for c in comparisons.values()):
        outcome = "holds"
    elif equivalence is not None and all(-equivalence < c["low"] and c["high"] < equivalence
                                         for c in comparisons.values()):
        outcome = "level"  # inside the equivalence margin; `below`/`above` says when the interval also excludes 0
        if any(c["high"] < 0 for c in comparisons.values()):
            outcome = "level, below"
        elif any(c["low"] > 0 for c in comparisons.values()):
            outcome = "level, above"
    elif any(c["high"] < 0 for c in comparisons.values()):
        outcome = "reversed"
    else:
        outcome = "not shown"
    return {"name": rule["name"], "claim": rule["claim"], "outcome": outcome, "comparisons": comparisons}


def room_verdict(rule: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
    """A declared rule of `kind: room` applied, per scenario and endpoint: where the ceiling leaves room over the
    reference (the lower end of ceiling − reference's interval above `room`), the method must capture at least
    `share` of it (the lower end of method − reference − share × (ceiling − reference) above 0); where it leaves
    none, the method must be non-inferior to the reference (the lower end of method − reference above −`margin`).
    The rule holds when every cell does."""
    confidence = rule.get("confidence", 0.95)
    method, ref, ceiling, share = rule["method"], rule["reference"], rule["ceiling"], rule["share"]
    cells = []
    for scenario in rule["scenarios"]:
        for endpoint in rule["endpoints"]:
            values = {m: per_seed(results, m, endpoint, [scenario]) for m in (method, ref, ceiling)}
            seeds = sorted(set.intersection(*(set(v) for v in values.values())))
            room = interval([values[ceiling][s] - values[ref][s] for s in seeds], confidence)
            gain = interval([values[method][s] - values[ref][s] for s in seeds], confidence)
            has_room = room["low"] > rule["room"]
            test = interval([values[method][s] - values[ref][s] - share * (values[ceiling][s] - values[ref][s])
                             for s in seeds], confidence) if has_room else gain
            holds = test["low"] > 0 if has_room else test["low"] > -rule["margin"]
            captured = gain["mean"] / room["mean"] if room["mean"] > 0 else None
            cells.append({"scenario": scenario, "endpoint": endpoint, "room": room, "has_room": has_room,
                          "gain": gain, "test": test, "captured": captured, "holds": holds})
    return {"name": rule["name"], "claim": rule["claim"], "outcome": "holds" if all(c["holds"] for c in cells)
            else "fails", "cells": cells}


def room(spec: dict[str, Any], results: list[dict[str, Any]], scenarios: list[str]) -> dict[str, Any]:
    """The room each ceiling leaves over the reference (a declaration's `room`: `reference`, `ceilings`,
    `threshold`), per endpoint: per scenario, ceiling − reference paired over seeds (95% interval) and whether the
    scenario has room (the interval's lower end above `threshold`). Scenarios without room are listed as such and
    left out of the mean room, which is over the scenarios with room only (None when none has any)."""
    reference, threshold = spec["reference"], spec["threshold"]
    found: dict[str, Any] = {}
    for ceiling in spec["ceilings"]:
        for endpoint in ("last_epoch", "auc"):
            cells = {s: paired(results, ceiling, reference, endpoint, [s], 0.95) for s in scenarios}
            with_room = [s for s in scenarios if cells[s]["low"] > threshold]
            found.setdefault(ceiling, {})[endpoint] = {
                "cells": {s: {**c, "has_room": s in with_room} for s, c in cells.items()},
                "with_room": with_room, "no_room": [s for s in scenarios if s not in with_room],
                "mean_room": paired(results, ceiling, reference, endpoint, with_room, 0.95) if with_room else None}
    return found


def report(declaration: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per scenario and method: accuracy per epoch and held-out accuracy with intervals, last-epoch accuracy and
    AUC per scenario, the declared pairs' differences, the room left by the ceilings (a declaration's `room`) and
    the declared verdicts."""
    scenarios, methods = declaration["scenarios"], declaration["methods"]
    table: dict[str, Any] = {}
    for scenario in scenarios:
        for method in methods:
            rows = [r for r in results if r["scenario"] == scenario and r["method"] == method]
            table[f"{scenario}/{method}"] = {
                "accuracy": [interval([r["accuracy"][e] for r in rows]) for e in range(declaration["testbed"]["epochs"])],
                "heldout_before": interval([r["heldout_before"] for r in rows]),
                "heldout_after": interval([r["heldout_after"] for r in rows]),
                "csr": interval([r["csr"] for r in rows])}
    overall = {m: {e: interval(list(per_seed(results, m, e, scenarios).values())) for e in ("last_epoch", "auc", "heldout")}
               for m in methods}
    by_scenario = {s: {m: {e: interval(list(per_seed(results, m, e, [s]).values())) for e in ("last_epoch", "auc")}
                       for m in methods} for s in scenarios}
    differences = {f"{a} - {b}": {e: {s: paired(results, a, b, e, [s], 0.95) for s in scenarios}
                                  for e in ("last_epoch", "auc")}
                   for a, b in declaration.get("report_pairs", [])}
    return {"table": table, "overall": overall, "by_scenario": by_scenario, "differences": differences,
            "room": room(declaration["room"], results, scenarios) if "room" in declaration else {},
            "verdicts": [room_verdict(rule, results) if rule.get("kind") == "room" else verdict(rule, results, scenarios)
                         for rule in declaration.get("rules", [])]}


def plot(declaration: dict[str, Any], summary: dict[str, Any], path: str) -> None:
    """Learning curves with their 95% bands, one panel per scenario, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    scenarios = declaration["scenarios"]
    fig, axes = plt.subplots(1, len(scenarios), figsize=(3.2 * len(scenarios), 3.2), sharey=True)
    for ax, scenario in zip(axes if len(scenarios) > 1 else [axes], scenarios):
        for method in declaration["methods"]:
            cells = summary["table"][f"{scenario}/{method}"]["accuracy"]
            epochs = range(1, len(cells) + 1)
            ax.plot(epochs, [c["mean"] for c in cells], label=method)
            ax.fill_between(epochs, [c["low"] for c in cells], [c["high"] for c in cells], alpha=0.2)
        ax.set_title(f"scenario {scenario}")
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    (axes[0] if len(scenarios) > 1 else axes).set_ylabel("training accuracy (mean, 95% band)")
    (axes[-1] if len(scenarios) > 1 else axes).legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _fmt(c: dict[str, float]) -> str:
    return "n/a" if c["mean"] is None else f"{c['mean']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}]"


def _mean(c: dict[str, float]) -> str:
    return "n/a" if c["mean"] is None else f"{c['mean']:.3f}"


def print_report(declaration: dict[str, Any], summary: dict[str, Any], seeds: list[int]) -> None:
    """The tables in Markdown."""
    methods, epochs = declaration["methods"], declaration["testbed"]["epochs"]
    print(f"{declaration['name']}: {len(seeds)} seeds {seeds[0]}-{seeds[-1]}, mean [95% interval] over seeds\n")
    print("| scenario | method | " + " | ".join(f"epoch {e}" for e in range(1, epochs + 1))
          + " | held-out before | held-out after |")
    print("|---|---|" + "---|" * (epochs + 2))
    for key, cell in summary["table"].items():
        scenario, method = key.split("/")
        print(f"| {scenario} | {method} | " + " | ".join(f"{c['mean']:.3f} ±{c['high'] - c['mean']:.3f}"
                                                        for c in cell["accuracy"])
              + f" | {_mean(cell['heldout_before'])} | {_mean(cell['heldout_after'])} |")
    print("\nper scenario, last-epoch accuracy and the area under the curve (mean accuracy over the epochs):\n")
    print("| scenario | " + " | ".join(methods) + " |\n|---|" + "---|" * len(methods))
    for scenario, cells in summary["by_scenario"].items():
        for endpoint in ("last_epoch", "auc"):
            print(f"| {scenario} {endpoint} | " + " | ".join(f"{cells[m][endpoint]['mean']:.3f}" for m in methods) + " |")
    print("\nmean over the scenarios, per seed, then over seeds:\n")
    print("| method | last-epoch accuracy | area under the curve | held-out accuracy after training |\n|---|---|---|---|")
    for m in methods:
        o = summary["overall"][m]
        print(f"| {m} | {_fmt(o['last_epoch'])} | {_fmt(o['auc'])} | {_fmt(o['heldout'])} |")
    pairs = list(summary["differences"])
    for endpoint in ("last_epoch", "auc") if pairs else ():
        print(f"\npaired differences, {endpoint}, per scenario (95% interval over seeds):\n")
        print("| scenario | " + " | ".join(pairs) + " |\n|---|" + "---|" * len(pairs))
        for s in declaration["scenarios"]:
            print(f"| {s} | " + " | ".join(_fmt(summary["differences"][p][endpoint][s]) for p in pairs) + " |")
    for ceiling, by_endpoint in summary["room"].items():
        spec = declaration["room"]
        print(f"\nroom: {ceiling} - {spec['reference']} per scenario; room where the interval's lower end is above "
              f"{spec['threshold']}:\n")
        print("| scenario | last epoch | | area under the curve | |\n|---|---|---|---|---|")
        for s in declaration["scenarios"]:
            cells = [by_endpoint[e]["cells"][s] for e in ("last_epoch", "auc")]
            print(f"| {s} | " + " | ".join(f"{_fmt(c)} | {'room' if c['has_room'] else 'no room'}" for c in cells)
                  + " |")
        for endpoint, found in by_endpoint.items():
            mean_room = "none" if found["mean_room"] is None else _fmt(found["mean_room"])
            print(f"- {endpoint}: room in {', '.join(found['with_room']) or 'no scenario'}; no room in "
                  f"{', '.join(found['no_room']) or 'no scenario'} (not averaged); mean room over the scenarios "
                  f"with room: {mean_room}")
    print("\nverdicts (declared rules):" if summary["verdicts"] else "\nno declared rules")
    for v in summary["verdicts"]:
        if "cells" in v:
            print(f"- {v['name']}: {v['outcome'].upper()} ({v['claim']})")
            print("\n| scenario | endpoint | room: ceiling - reference | method - reference | captured | test | verdict |"
                  "\n|---|---|---|---|---|---|---|")
            for c in v["cells"]:
                captured = "" if c["captured"] is None else f"{c['captured']:.0%}"
                kind = "capture" if c["has_room"] else "no room: non-inferior"
                print(f"| {c['scenario']} | {c['endpoint']} | {_fmt(c['room'])} | {_fmt(c['gain'])} | {captured} | "
                      f"{kind} {_fmt(c['test'])} | {'holds' if c['holds'] else 'FAILS'} |")
            continue
        comps = "; ".join(f"{k} {_fmt(c)}" for k, c in v["comparisons"].items())
        print(f"- {v['name']}: {v['outcome'].upper()} ({v['claim']}; {comps})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("declaration", help="The contest's declaration (YAML).")
    parser.add_argument("--seeds", default=None, help="Override the declared seeds (a smoke run), e.g. 0-1.")
    parser.add_argument("--out", default=None, help="Keep the runs here (default: a temporary directory).")
    parser.add_argument("--save", default=None, help="Write the raw results and the report as JSON here.")
    parser.add_argument("--plot", default=None, help="Draw the learning curves with their bands here (PNG).")
    parser.add_argument("--jobs", type=int, default=1, help="Runs in parallel processes [1].")
    parser.add_argument("--results", default=None, help="Report saved results (a --save file) instead of running.")
    parser.add_argument("--resume", action="store_true",
                        help="Keep the runs of this declaration already finished in --out and play only the rest "
                             "(after a crash; unfinished run directories are played again, not continued).")
    parser.add_argument("--from-runs", default=None, help="Report the finished runs of this --out directory instead "
                                                          "of running.")
    args = parser.parse_args()
    if args.resume and not args.out:
        parser.error("--resume needs --out (where the finished runs are)")
    declaration = yaml.safe_load(Path(args.declaration).read_text())
    seeds = parse_seeds(args.seeds or declaration["seeds"])
    for rule in declaration.get("rules", []):  # an untabled confidence: refused before any run
        t_quantile(max(len(seeds) - 1, 1), rule.get("confidence", 0.95))  # (one seed, a smoke run: no interval)
    if args.results:
        results = json.loads(Path(args.results).read_text())["results"]
    elif args.from_runs:
        results = [r for r in results_of(args.from_runs, declaration["testbed"]["epochs"]) if r["seed"] in seeds]
    else:
        with tempfile.TemporaryDirectory() as tmp:
            done = [r for r in results_of(args.out, declaration["testbed"]["epochs"])
                    if r["seed"] in seeds and r["scenario"] in declaration["scenarios"]
                    and r["method"] in declaration["methods"]] if args.resume else []
            results = run_all(declaration, seeds, args.out or tmp, args.jobs, done)
    if args.save:  # the raw results first: nothing played is lost if the report fails
        Path(args.save).write_text(json.dumps({"declaration": declaration, "seeds": seeds, "results": results},
                                              indent=1))
    summary = report(declaration, results)
    if args.save:
        Path(args.save).write_text(json.dumps({"declaration": declaration, "seeds": seeds, "results": results,
                                               "report": summary}, indent=1))
    if args.plot:
        plot(declaration, summary, args.plot)
    print_report(declaration, summary, seeds)


if __name__ == "__main__":
    main()
