"""How many BigCodeBench tasks a `task_func` returning an object that equals everything passes.

    python -m benchmarks.perf.bcb_equals [--data ../shared/data/bigcodebench] [--all-libs] [--workers 2]

A weakness of BigCodeBench's own tests (an equality test passes whatever the function computed);
such a value never reaches the tests' process as itself (it arrives as a stand-in equal only to
itself: `bcb_processes.py`), so the answer should be 0. Prints each task passed, then the
counts per status and the wall time; exit status 1 if any task passed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from memrl_bench.adapters.bigcodebench.benchmark import BigCodeBench

REPO = Path(__file__).resolve().parents[2]
PROGRAM = '''class Anything:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __hash__(self):
        return 0


def task_func(*args, **kwargs):
    return Anything()
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "bigcodebench"))
    parser.add_argument("--all-libs", action="store_true", help="also tasks needing third-party libraries")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=30)
    args = parser.parse_args()
    bench = BigCodeBench(data=args.data, stdlib_only=not args.all_libs, timeout=args.timeout)
    rows = sorted(bench._rows.values(), key=lambda row: int(row["task_id"].split("/")[-1]))
    start = time.monotonic()
    counts: Counter[str] = Counter()
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        for row, verdict in zip(rows, pool.map(lambda row: bench.evaluate(PROGRAM, row["test"]), rows)):
            counts[verdict.status] += 1
            if verdict.passed:
                print(f"{row['task_id']}\tPASS", flush=True)
    print(f"{counts['PASS']}/{len(rows)} tasks passed by an object that equals everything; "
          + ", ".join(f"{status} {n}" for status, n in counts.most_common())
          + f"; {time.monotonic() - start:.0f} s wall")
    sys.exit(1 if counts["PASS"] else 0)


if __name__ == "__main__":
    main()
