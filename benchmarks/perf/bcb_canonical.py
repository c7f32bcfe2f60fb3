"""How many BigCodeBench reference solutions pass in our sandbox (a check of the evaluator itself).

    python -m benchmarks.perf.bcb_canonical --data ../shared/data/bigcodebench [--all-libs] [--workers 2]

By default only the tasks that need nothing beyond the standard library (327 of 1140) are run.
Prints one line per non-passing task, then the counts per status and the wall time.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from memrl_bench.adapters.bigcodebench.benchmark import BigCodeBench, Verdict, canonical_program, prompt_imports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="bigcodebench_{subset}.jsonl or its directory")
    parser.add_argument("--subset", default="full", choices=("full", "hard"))
    parser.add_argument("--all-libs", action="store_true", help="also tasks needing third-party libraries")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--sandbox", default="bwrap", choices=("bwrap", "none"),
                        help="none runs the reference solutions on this machine as you: some write outside "
                             "their directory (BigCodeBench/832 creates /non/existent/path, after which 288 "
                             "and 350 fail)")
    args = parser.parse_args()

    bench = BigCodeBench(data=args.data, subset=args.subset, stdlib_only=not args.all_libs,
                         timeout=args.timeout, sandbox=args.sandbox)
    rows = sorted(bench._rows.values(), key=lambda row: int(row["task_id"].split("/")[-1]))

    def check(row: dict) -> tuple[str, Verdict]:
        return row["task_id"], bench.evaluate(canonical_program(row), row["test"],
                                                imports=prompt_imports(row["complete_prompt"]))

    start = time.monotonic()
    counts: Counter[str] = Counter()
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        for task_id, verdict in pool.map(check, rows):
            counts[verdict.status] += 1
            if not verdict.passed:
                detail = verdict.detail.replace("\n", " | ")[-300:]
                print(f"{task_id}\t{verdict.status}\t{verdict.seconds:.1f}s\t{detail}", flush=True)
    elapsed = time.monotonic() - start
    print(f"\n{counts['PASS']}/{len(rows)} reference solutions pass; "
          + ", ".join(f"{status} {n}" for status, n in counts.most_common()) + f"; {elapsed:.0f} s wall")


if __name__ == "__main__":
    main()
