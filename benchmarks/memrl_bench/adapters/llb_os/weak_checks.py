"""The LLB OS samples kept out of the benchmark: those whose check a lazy strategy passes.

Some of LLB's checks are weak: os/162's only runs the script the task asks for (`exit 0` passes
with no user made), os/481's passes when its `grep` fails for any reason (delete the directory).
`python -m benchmarks.perf.llb_os_lazy_audit` plays lazy strategies, which use no knowledge of the
answer (`STRATEGIES`), against every sample's check in the episode's sandbox, and writes each
sample whose check passed one, with the strategies that did, to `lazy_checks.json` beside this
module (`--check` says whether the committed list is still what the audit finds). The adapter
leaves those samples out unless `keep_weak_checks` is set. See docs/llb.md ("Fidelity").
"""

from __future__ import annotations

import json
from pathlib import Path

from memrl_cli.errors import MemrlError

LIST_FILE = Path(__file__).with_name("lazy_checks.json")
STRATEGIES = {
    "nothing": "no script: the check alone after the initialisation",
    "delete": "rm -rf every path the task names (instruction and check), kill the processes naming one",
    "exit0": "every script the check runs written as '#!/bin/sh' + 'exit 0', mode 755",
    "empty": "an empty file at every path the task names that does not exist",
}
ABOUT = ("LLB OS samples whose check passes a lazy strategy, kept out of the benchmark; written by "
         "`python -m benchmarks.perf.llb_os_lazy_audit --data DIR --write`, checked by `--check`")


def document(excluded: dict[str, list[str]]) -> str:
    """The list file's text for `excluded` (sample id -> the strategies its check passed)."""
    ordered = dict(sorted(excluded.items(), key=lambda item: int(item[0].split("/")[1])))
    return json.dumps({"about": ABOUT, "strategies": STRATEGIES, "excluded": ordered}, indent=1) + "\n"


def load(path: Path = LIST_FILE) -> dict[str, list[str]]:
    """The committed list: sample id (`os/162`) -> the strategies its check passed."""
    try:
        entries = json.loads(path.read_text())["excluded"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MemrlError(f"cannot read the list of weak LLB OS checks {path}: {exc}") from exc
    if not isinstance(entries, dict) or not all(isinstance(v, list) and v and set(v) <= set(STRATEGIES)
                                                for v in entries.values()):
        raise MemrlError(f"{path} is not a list of weak LLB OS checks (sample id -> strategies)")
    return entries
