"""Play every known attack of a hostile agent (benchmarks/hostile.py) and count those contained.

    python -m benchmarks.perf.hostile [--data DIR] [--only bigcodebench,llb-db] [--option llb-os.backend=bwrap]

The agent is a scripted Chat Completions server on 127.0.0.1 (tests/chat_server.py) answering
each benchmark with its attacks. Prints one line per attack, the honest episode played after
each benchmark's attacks (the run must go on), then "N attacks, N contained". A benchmark whose
data or environment is missing is reported as skipped, with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import hostile
from memrl_cli.errors import MemrlError

REPO = Path(__file__).resolve().parents[2]


def data_paths(root: Path, scratch: Path) -> dict[str, str]:
    """Where each benchmark's data is under `root` (the shared data layout); HLE gets its own file."""
    return {"bigcodebench": str(root / "bigcodebench"), "llb-os": str(root / "llb"), "llb-db": str(root / "llb"),
            "hle": hostile.hle_data(scratch)}


def measure(data: Path, only: tuple[str, ...] = hostile.BENCHMARKS,
            options: dict[str, dict[str, Any]] | None = None, echo: bool = True) -> dict[str, Any]:
    """Run the attacks on the `only` benchmarks; return the outcomes, honest results and skips."""
    sys.path.insert(0, str(REPO / "tests"))
    from chat_server import ScriptedChatServer

    from memrl_cli.llm import ChatClient, LLMSettings

    options = options or {}
    outcomes: list[hostile.Outcome] = []
    honest: dict[str, str] = {}
    skipped: dict[str, str] = {}
    script, arena = hostile.AttackScript(), hostile.Arena()
    with contextlib.closing(arena), tempfile.TemporaryDirectory() as scratch, ScriptedChatServer(script) as server:
        llm = ChatClient(LLMSettings(model="hostile", base_url=server.base_url, api_key="test", max_retries=0))
        paths = data_paths(data, Path(scratch))
        for name in only:
            try:
                bench = hostile.make_adapter(name, paths, options.get(name))
            except MemrlError as exc:
                skipped[name] = str(exc)
                if echo:
                    print(f"{name}: skipped ({exc})", flush=True)
                continue
            try:
                for attack in (a for a in hostile.ATTACKS if a.benchmark == name):
                    try:
                        outcome = hostile.run_attack(attack, bench, llm, script, arena)
                    except Exception as exc:  # the run did not go on: never contained
                        outcome = hostile.Outcome(attack.name, name, "CRASH", False, f"{type(exc).__name__}: {exc}")
                    outcomes.append(outcome)
                    if echo:
                        verdict = "contained" if outcome.contained else f"NOT CONTAINED: {outcome.reason}"
                        print(f"{name}\t{attack.name}\t{outcome.status}\t{verdict}", flush=True)
                episode = hostile.honest_episode(bench, llm, script)
                honest[name] = episode.status
                if echo:
                    print(f"{name}\thonest episode after the attacks\t{episode.status}", flush=True)
            finally:
                bench.close()
    contained = sum(outcome.contained for outcome in outcomes)
    return {"attacks": len(outcomes), "contained": contained, "honest": honest, "skipped": skipped,
            "outcomes": [outcome.__dict__ for outcome in outcomes]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data"),
                        help="directory holding bigcodebench/ and llb/ [../shared/data]")
    parser.add_argument("--only", default=",".join(hostile.BENCHMARKS), help="comma-separated benchmarks")
    parser.add_argument("--option", action="append", default=[], metavar="BENCH.KEY=VALUE",
                        help="an adapter option, e.g. llb-os.backend=docker (repeatable)")
    args = parser.parse_args()
    options: dict[str, dict[str, Any]] = {}
    for item in args.option:
        key, _, value = item.partition("=")
        bench, _, name = key.partition(".")
        options.setdefault(bench, {})[name] = value
    result = measure(Path(args.data), tuple(args.only.split(",")), options)
    failed_honest = {name: status for name, status in result["honest"].items()
                     if status not in ("PASS", "CORRECT")}
    print(f"{result['attacks']} attacks, {result['contained']} contained"
          + (f"; honest episodes that failed after the attacks: {failed_honest}" if failed_honest else ""))
    sys.exit(0 if result["attacks"] == result["contained"] and not failed_honest else 1)


if __name__ == "__main__":
    main()
