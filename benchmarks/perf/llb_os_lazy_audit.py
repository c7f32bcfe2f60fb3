"""Which LLB OS checks a lazy agent passes: the audit that keeps weak checks out of the benchmark.

Each sample's check is played against strategies that use no knowledge of the answer, each in a
fresh sandbox run exactly as an episode runs it (`llb_os_ground_truth.run_scripts`: the
initialisation script, the lazy "agent" script, then the check in its own world):

- `nothing`: no script at all (what `llb_os_ground_truth` calls "without the ground truth");
- `delete`: `rm -rf` every path the task names (absolute or `~/` paths of the instruction and of
  the check), and kill every process whose command line holds one of them;
- `exit0`: every script the check runs (`/x`, `~/x`, `./x`, `bash x` in command position) written
  as `#!/bin/sh` + `exit 0`, mode 755, its directories made;
- `empty`: an empty file at every named path that does not exist yet (a neighbour of the two
  above: it passes checks that only test that a path exists).

A strategy whose script would be the same as an earlier one's for a sample (no path named: `delete`
is `nothing`) is not played again. A sample whose check passes any strategy is kept out of the
benchmark: its id and the strategies that passed go to the adapter's committed list
(`memrl_bench.adapters.llb_os.weak_checks`, `lazy_checks.json`).

    python -m benchmarks.perf.llb_os_lazy_audit --data ../shared/data/llb [--backend auto|docker|bwrap]
        [--workers 2] [--limit N] [--json OUT] [--write | --check]

Prints per strategy how many checks it passed and their ids, then the wall time; `--json` writes
the per-sample results, `--write` the committed list, `--check` exits 1 when the committed list
differs from this run's.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.perf.llb_os_ground_truth import run_scripts, sample_arguments
from memrl_bench.adapters.llb_os import weak_checks
from memrl_bench.adapters.llb_os.benchmark import SPLIT_FILES, LLBOperatingSystem
from memrl_bench.environments.os_machines.os_check_view import named_paths
from memrl_bench.environments.os_machines.os_sandbox import SandboxFactory
from memrl_bench.framework.protocol import Task

STRATEGIES = weak_checks.STRATEGIES
# A path in command position: after the start of a line, a separator (; & | ( ` ! {), a keyword
# that precedes a command, or a shell that runs a file (`bash x`, `sh -e x`, `source x`, `. x`).
_RUN = re.compile(
    r"(?:^|(?<=[;&|(`!{\n]))[ \t]*"
    r"(?:(?:then|do|else|elif|if|while|until|exec|time|sudo|command|bash|sh|dash|source|\.)[ \t]+(?:-\w+[ \t]+)*)*"
    r"[\"']?(?P<path>(?:~|\.{1,2})?/[\w.][\w.+@%,/-]*)", re.M)
_SHELL_FILE = re.compile(r"(?:^|(?<=[;&|(`!{\n]))[ \t]*(?:bash|sh|dash|source|\.)[ \t]+(?:-(?!c\b)\w+[ \t]+)*"
                         r"[\"']?(?P<path>[\w.][\w.+@%,-]*)", re.M)  # a file, not `sh -c '...'`
_SYSTEM_TREES = ("/usr/", "/bin/", "/sbin/", "/lib")  # the check always runs the image's own programs there
_NOT_FILES = ("/proc", "/sys", "/dev")
_TRAILING = ".,:;!?"  # prose punctuation after a path in an instruction


def task_paths(task: Task) -> list[str]:
    """Every path the task names: in its instruction (without a trailing full stop or comma) and in
    its check, `~` as /root; none under /proc, /sys or /dev."""
    found = set(named_paths(task.payload["check"]))
    found |= {path.rstrip(_TRAILING) for path in named_paths(task.query)} - {"", "/"}
    return sorted(p for p in found if not any(p == top or p.startswith(top + "/") for top in _NOT_FILES))


def run_paths(check: str) -> list[str]:
    """The files `check` runs as programs or shell scripts (`~` as /root, relative ones from the
    check's directory, /), none under /proc, /sys or /dev."""
    found = {match.group("path") for match in _RUN.finditer(check)}
    found |= {match.group("path") for match in _SHELL_FILE.finditer(check) if match.group("path") not in (".", "..")}
    absolute = {posixpath.normpath("/root" + path[1:] if path.startswith("~") else path if path.startswith("/")
                                   else "/" + path) for path in found}
    return sorted(p for p in absolute if p != "/" and not any(p == top or p.startswith(top + "/") for top in _NOT_FILES))


def lazy_scripts(task: Task) -> dict[str, str]:
    """The agent script of each strategy for `task` (the module docstring). A program of the image
    is never replaced (the check runs the image's own), a path of its system trees only when absent."""
    paths = task_paths(task)
    quoted = " ".join(shlex.quote(path) for path in paths)
    patterns = " ".join(f"-e {shlex.quote(path)}" for path in paths)
    delete = (f"rm -rf -- {quoted} 2>/dev/null\n"
              f"for d in /proc/[0-9]*; do [ \"${{d#/proc/}}\" = \"$$\" ] && continue; "
              f"grep -qaF {patterns} \"$d/cmdline\" 2>/dev/null && kill -9 \"${{d#/proc/}}\" 2>/dev/null; done\n"
              "true") if paths else ""
    stubs = ""
    for path in run_paths(task.payload["check"]):
        target, parent = shlex.quote(path), shlex.quote(posixpath.dirname(path))
        stub = f"mkdir -p {parent}; rm -rf -- {target}; printf '#!/bin/sh\\nexit 0\\n' > {target}; chmod 755 {target}"
        stubs += f"[ -e {target} ] || {{ {stub}; }}\n" if path.startswith(_SYSTEM_TREES) else stub + "\n"
    empty = "".join(f"[ -e {shlex.quote(path)} ] || {{ mkdir -p {shlex.quote(posixpath.dirname(path))}; "
                    f": > {shlex.quote(path)}; }}\n" for path in paths)
    return {"nothing": "", "delete": delete, "exit0": stubs, "empty": empty}


def audit_task(sandboxes: SandboxFactory, task: Task) -> dict[str, bool | None]:
    """Whether the check passed after each strategy (None: the initialisation failed, as the
    fidelity script reports); a strategy with the same script as an earlier one shares its result."""
    played: dict[str, bool | None] = {}
    outcome: dict[str, bool | None] = {}
    for strategy, script in lazy_scripts(task).items():
        if script not in played:
            results = run_scripts(sandboxes, task.payload["init"], [script] if script else [], task.payload["check"])
            check = results[-1]
            played[script] = None if len(results) == 1 else check.exit_code == 0 and not check.timed_out
        outcome[strategy] = played[script]
    return outcome


def excluded(tasks: list[Task], outcomes: list[dict[str, bool | None]]) -> dict[str, list[str]]:
    """The committed list's entries: each sample whose check passed a strategy, with those strategies."""
    return {task.id: [s for s in STRATEGIES if outcome[s]] for task, outcome in zip(tasks, outcomes)
            if any(outcome[s] for s in STRATEGIES)}


def main() -> None:
    parser = sample_arguments(__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="write each sample's outcome per strategy to this file")
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--write", action="store_true", help=f"write the committed list ({weak_checks.LIST_FILE})")
    chosen.add_argument("--check", action="store_true", help="exit 1 when the committed list differs from this run")
    args = parser.parse_args()
    adapter = LLBOperatingSystem(data=args.data, limit=args.limit, backend=args.backend, rootfs=args.rootfs,
                                 keep_weak_checks=True)
    backend = adapter.sandboxes.resolve()
    tasks = [task for split in SPLIT_FILES for task in adapter.tasks(split)]
    started = time.monotonic()
    with ThreadPoolExecutor(args.workers) as pool:
        outcomes = list(pool.map(lambda task: audit_task(adapter.sandboxes, task), tasks))
    elapsed = time.monotonic() - started
    for task, outcome in zip(tasks, outcomes):
        if None in outcome.values():
            print(f"{task.id} initialisation failed: not audited")
    for strategy in STRATEGIES:
        ids = [task.id for task, outcome in zip(tasks, outcomes) if outcome[strategy]]
        print(f"{strategy}: {len(ids)}/{len(tasks)} checks pass{': ' if ids else ''}{' '.join(ids)}")
    found = excluded(tasks, outcomes)
    print(f"backend {backend}: {len(found)}/{len(tasks)} checks pass a lazy strategy, {elapsed:.0f} s "
          f"({elapsed / max(1, len(tasks)):.2f} s per sample, {args.workers} workers)")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"backend": backend, "seconds": round(elapsed), "workers": args.workers, "strategies": list(STRATEGIES),
             "samples": {task.id: outcome for task, outcome in zip(tasks, outcomes)}, "excluded": found}, indent=1))
    if args.write:
        weak_checks.LIST_FILE.write_text(weak_checks.document(found))
        print(f"wrote {weak_checks.LIST_FILE}")
    if args.check:
        audited = {task.id for task in tasks}
        committed = {i: s for i, s in weak_checks.load().items() if i in audited}
        if committed != found:
            added = sorted(set(found) - set(committed))
            gone = sorted(set(committed) - set(found))
            changed = sorted(i for i in set(found) & set(committed) if found[i] != committed[i])
            print(f"the committed list is out of date: new {added}, no longer passing {gone}, changed {changed}")
            sys.exit(1)
        print("the committed list is up to date")


if __name__ == "__main__":
    main()
