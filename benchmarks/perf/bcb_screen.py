"""False refusals of the BigCodeBench static screen: run it on every reference solution.

    python -m benchmarks.perf.bcb_screen [--data ../shared/data/bigcodebench] [--subset full]

Prints each refused reference solution with its reasons, then "N/M reference solutions refused".
Exit status 1 if any is refused. Nothing runs: the screen only reads the code (about a second).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from memrl_bench.adapters.bigcodebench.screen import screen
from memrl_bench.adapters.bigcodebench.benchmark import _load_rows, canonical_program

REPO = Path(__file__).resolve().parents[2]


def refusals(data: str, subset: str = "full") -> dict[str, list[str]]:
    """Task id -> the screen's reasons, for every reference solution it refuses."""
    rows, _ = _load_rows(data, subset, None)
    found = {row["task_id"]: screen(canonical_program(row)) for row in rows}
    return {task_id: reasons for task_id, reasons in found.items() if reasons}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "bigcodebench"))
    parser.add_argument("--subset", default="full", choices=("full", "hard"))
    args = parser.parse_args()
    start = time.monotonic()
    rows, _ = _load_rows(args.data, args.subset, None)
    refused = refusals(args.data, args.subset)
    for task_id, reasons in refused.items():
        print(f"{task_id}\t{'; '.join(reasons)}")
    print(f"{len(refused)}/{len(rows)} reference solutions refused ({time.monotonic() - start:.1f} s)")
    sys.exit(1 if refused else 0)


if __name__ == "__main__":
    main()
