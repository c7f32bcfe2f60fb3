"""How many LLB OS ground truths reproduce in this machine's sandbox (a check of the environment).

For each sample, in a fresh sandbox: the initialisation script, the ground-truth script, then
the check as an episode runs it, in the check's world (should exit 0); and, in another fresh
sandbox, the initialisation script and the check alone (should fail: otherwise the check
passes without any work). The samples whose check a lazy strategy passes (the adapter's
`weak_checks`, found by `llb_os_lazy_audit`) are left out, as the benchmark leaves them out;
`--keep-weak-checks` checks all.

    python -m benchmarks.perf.llb_os_ground_truth --data ../shared/data/llb [--workers 2] [--limit N]
        [--backend auto|docker|bwrap] [--keep-weak-checks]

Prints how many samples are left out, one line per sample that does not behave, then the counts
and the wall time.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

from memrl_bench.adapters.llb_os.benchmark import SPLIT_FILES, LLBOperatingSystem
from memrl_bench.environments.os_machines.os_machine import CommandResult
from memrl_bench.environments.os_machines.os_sandbox import SandboxFactory
from memrl_bench.framework.protocol import Task


def run_scripts(sandboxes: SandboxFactory, init: str, scripts: list[str], check: str) -> list[CommandResult]:
    """In one fresh sandbox: `init` (stop there if it fails, as an episode would), `scripts`, then
    `check` as an episode grades it (trusted: in the pristine image, the agent's state as data)."""
    sandbox = sandboxes.create()
    try:
        results = [sandbox.run(init)]
        if results[0].exit_code == 0:
            results += [sandbox.run(script) for script in scripts] + [sandbox.run(check, trusted=True)]
        return results
    finally:
        sandbox.close()


def check_task(sandboxes: SandboxFactory, task: Task) -> tuple[bool, bool, str]:
    """(ground truth passes the check?, check fails without it?, detail of what went wrong)."""
    payload = task.payload
    with_truth = run_scripts(sandboxes, payload["init"], [payload["ground_truth"]], payload["check"])
    without = run_scripts(sandboxes, payload["init"], [], payload["check"])
    reproduced = len(with_truth) == 3 and with_truth[-1].exit_code == 0
    discriminates = len(without) == 2 and without[-1].exit_code != 0
    shown = with_truth[0] if len(with_truth) == 1 else with_truth[1]  # the failing init, else the truth
    step = "init" if len(with_truth) == 1 else f"check exit {with_truth[-1].exit_code}; ground truth"
    timeout = " (timeout)" if shown.timed_out else ""
    detail = f"{step}: exit {shown.exit_code}{timeout} {shown.output.strip()[:200]!r}"
    return reproduced, discriminates, detail


def sample_arguments(description: str) -> argparse.ArgumentParser:
    """The options of a script that plays every LLB-OS sample's check (this one, `llb_os_lazy_audit`)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--data", required=True, help="directory holding os_interaction_{train,val}.json")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None, help="first N samples of each split")
    parser.add_argument("--backend", default="auto", choices=("auto", "docker", "bwrap"))
    parser.add_argument("--rootfs", default=None)
    return parser


def main() -> None:
    parser = sample_arguments(__doc__.splitlines()[0])
    parser.add_argument("--keep-weak-checks", action="store_true", help="also the samples whose check is weak")
    args = parser.parse_args()
    adapter = LLBOperatingSystem(data=args.data, limit=args.limit, backend=args.backend, rootfs=args.rootfs,
                                 keep_weak_checks=args.keep_weak_checks)
    backend = adapter.sandboxes.resolve()
    left_out = adapter.left_out()
    if left_out:  # (the adapter's line names `memrl bench`'s option; this script's is --keep-weak-checks)
        print(left_out["text"].replace("--option keep_weak_checks=true", "--keep-weak-checks"))
    tasks = [task for split in SPLIT_FILES for task in adapter.tasks(split)]
    started = time.monotonic()
    with ThreadPoolExecutor(args.workers) as pool:
        results = list(pool.map(lambda task: check_task(adapter.sandboxes, task), tasks))
    elapsed = time.monotonic() - started
    for task, (reproduced, discriminates, detail) in zip(tasks, results):
        if not reproduced:
            print(f"{task.id} ground truth does not pass: {detail}")
        if not discriminates:
            print(f"{task.id} check passes without the ground truth")
    reproduced = sum(result[0] for result in results)
    discriminating = sum(result[1] for result in results)
    print(f"backend {backend}: {reproduced}/{len(tasks)} ground truths pass, {discriminating}/{len(tasks)} checks "
          f"fail without them, {elapsed:.0f} s ({elapsed / max(1, len(tasks)):.2f} s per sample, "
          f"{args.workers} workers)")


if __name__ == "__main__":
    main()
