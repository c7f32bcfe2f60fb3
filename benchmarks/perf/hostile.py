"""Play every known attack of a hostile agent (benchmarks/testing/hostile.py) and count those contained.

    python -m benchmarks.perf.hostile [--data DIR] [--only bigcodebench,llb-os:docker] [--option llb-os.nproc=64]

The agent is a scripted Chat Completions server on 127.0.0.1 (benchmarks/testing/chat_server.py) answering
each benchmark with its attacks, on every target of `hostile.TARGETS`: the LLB attacks run on
both backends of each benchmark (bubblewrap and Docker for LLB-OS, MariaDB and MariaDB in Docker
for LLB-DB). Prints one line per attack, the honest episode played after each target's attacks
(the run must go on), then "N attacks, N contained". A target whose data or environment is
missing (no Docker daemon, no bubblewrap) is reported as skipped, with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.testing import hostile
from memrl_cli.errors import MemrlError

REPO = Path(__file__).resolve().parents[2]


def data_paths(root: Path, scratch: Path) -> dict[str, str]:
    """Where each benchmark's data is under `root` (the shared data layout; BigCodeBench's, without it there,
    the sample committed with the tests: the attacks play two of its tasks); HLE gets its own file."""
    bigcodebench = root / "bigcodebench"
    if not (bigcodebench / "bigcodebench_full.jsonl").is_file():
        bigcodebench = REPO / "tests" / "data" / "bigcodebench"
    return {"bigcodebench": str(bigcodebench), "llb-os": str(root / "llb"), "llb-db": str(root / "llb"),
            "hle": hostile.hle_data(scratch)}


def targets(only: tuple[str, ...]) -> list[str]:
    """The targets named by `only`: target names, or benchmark names for all targets of the benchmark."""
    chosen = [name for name, (benchmark, _) in hostile.TARGETS.items() if name in only or benchmark in only]
    unknown = set(only) - set(hostile.TARGETS) - set(hostile.BENCHMARKS)
    if unknown:
        raise MemrlError(f"unknown target {', '.join(sorted(unknown))}; choose from {', '.join(hostile.TARGETS)}")
    return chosen


def measure(data: Path, only: tuple[str, ...] = tuple(hostile.TARGETS),
            options: dict[str, dict[str, Any]] | None = None, echo: bool = True) -> dict[str, Any]:
    """Run the attacks on the `only` targets; return the outcomes, honest results, skips and times.

    `options` maps a benchmark (all its targets) or a target to adapter options, over the target's.
    """
    from benchmarks.testing.chat_server import ScriptedChatServer

    from memrl_bench.framework.llm import ChatClient, LLMSettings

    options = options or {}
    outcomes: list[hostile.Outcome] = []
    honest: dict[str, str] = {}
    skipped: dict[str, str] = {}
    seconds: dict[str, float] = {}
    script, arena = hostile.AttackScript(), hostile.Arena()
    with contextlib.closing(arena), tempfile.TemporaryDirectory() as scratch, ScriptedChatServer(script) as server:
        llm = ChatClient(LLMSettings(model="hostile", base_url=server.base_url, api_key="test", max_retries=0))
        paths = data_paths(data, Path(scratch))
        for target in targets(only):
            benchmark, backend = hostile.TARGETS[target]
            started = time.monotonic()
            servers = hostile.own_servers() if benchmark == "llb-db" else contextlib.nullcontext()
            with servers:
                try:
                    bench = hostile.make_adapter(benchmark, paths, {**backend, **options.get(benchmark, {}),
                                                                     **options.get(target, {})})
                except MemrlError as exc:
                    skipped[target] = str(exc)
                    if echo:
                        print(f"{target}: skipped ({exc})", flush=True)
                    continue
                try:
                    hostile.prepare(bench)
                except MemrlError as exc:
                    bench.close()
                    skipped[target] = str(exc)
                    if echo:
                        print(f"{target}: skipped ({exc})", flush=True)
                    continue
                try:
                    for attack in (a for a in hostile.ATTACKS if a.benchmark == benchmark):
                        try:
                            outcome = hostile.run_attack(attack, bench, llm, script, arena)
                        except Exception as exc:  # the run did not go on: never contained
                            outcome = hostile.Outcome(attack.name, benchmark, "CRASH", False,
                                                      f"{type(exc).__name__}: {exc}")
                        outcome = hostile.Outcome(outcome.attack, target, outcome.status, outcome.contained,
                                                  outcome.reason)
                        outcomes.append(outcome)
                        if echo:
                            verdict = "contained" if outcome.contained else f"NOT CONTAINED: {outcome.reason}"
                            print(f"{target}\t{attack.name}\t{outcome.status}\t{verdict}", flush=True)
                    episode = hostile.honest_episode(bench, llm, script)
                    honest[target] = episode.status
                    if echo:
                        print(f"{target}\thonest episode after the attacks\t{episode.status}", flush=True)
                finally:
                    bench.close()
            seconds[target] = round(time.monotonic() - started, 1)
    contained = sum(outcome.contained for outcome in outcomes)
    return {"attacks": len(outcomes), "contained": contained, "honest": honest, "skipped": skipped,
            "seconds": seconds, "outcomes": [outcome.__dict__ for outcome in outcomes]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data"),
                        help="directory holding bigcodebench/ and llb/ [../shared/data]")
    parser.add_argument("--only", default=",".join(hostile.TARGETS),
                        help=f"comma-separated targets or benchmarks [{','.join(hostile.TARGETS)}]")
    parser.add_argument("--option", action="append", default=[], metavar="TARGET.KEY=VALUE",
                        help="an adapter option for a benchmark or a target, e.g. llb-os.nproc=64 (repeatable)")
    args = parser.parse_args()
    options: dict[str, dict[str, Any]] = {}
    for item in args.option:
        key, _, value = item.partition("=")
        bench, _, name = key.partition(".")
        options.setdefault(bench, {})[name] = value
    try:
        result = measure(Path(args.data), tuple(args.only.split(",")), options)
    except MemrlError as exc:
        parser.error(str(exc))
    failed_honest = {name: status for name, status in result["honest"].items()
                     if status not in ("PASS", "CORRECT")}
    print("seconds per target: " + ", ".join(f"{name} {took:g}" for name, took in result["seconds"].items()))
    print(f"{result['attacks']} attacks, {result['contained']} contained"
          + (f" (skipped: {', '.join(result['skipped'])})" if result["skipped"] else "")
          + (f"; honest episodes that failed after the attacks: {failed_honest}" if failed_honest else ""))
    sys.exit(0 if result["attacks"] == result["contained"] and not failed_honest else 1)


if __name__ == "__main__":
    main()
