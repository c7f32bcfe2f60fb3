"""The judges' ceilings on the synthetic testbed: measurement devices run through the real harness, not methods.

A *judge* is a pseudo-method of `benchmarks.learning.table` and `contest` (never a `--method` of
`memrl bench`, never a `--selector`): the harness runs `rag` with a wide candidate list, and the
testbed's agent sees only the memories the judge's chooser picks (`synthetic.choose`), with the same
stream, the same luck per attempt and the same recall as every method:

* `oracle`: the cheating selector over the **whole bank** (every memory is a candidate: k1 = k2 =
  `WHOLE_BANK`, no threshold): it reads the true utility (`synthetic.utility`) and shows up to k2
  useful memories, the newest first, never a misleading one. Without peeking at the luck no selector
  does better in expectation, so its accuracy is the scenario's ceiling;
* `oracle-recall`: the same among Phase A's k1 candidates (the ceiling of Phase B given the recall
  every method shares);
* `no-failures` and `newest`: two fixed rules over Phase A's candidates, for comparison: rag's order
  without failed episodes ("never show failures"), and the newest k2 ("always show the newest").

`contest.room` compares a ceiling with `rag` seed by seed: a scenario where the ceiling is not above rag
has no room for any selector, and is reported as such (docs/learning.md, "The testbed's ceilings and regimes").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

JUDGES = ("oracle", "oracle-recall", "no-failures", "newest")
CHOOSERS = ("oracle", "no-failures", "newest")
WHOLE_BANK = 4096  # k1's limit: every memory of the testbed's banks (at most a few hundred)


def judge_settings(judge: str, k1: int, k2: int, threshold: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """(BenchConfig settings, adapter options) of a judge: `rag` with the judge's candidate list, and its chooser
    showing `k2` of them."""
    if judge not in JUDGES:
        raise ValueError(f"unknown judge {judge!r}; choose one of {', '.join(JUDGES)}")
    chooser = "oracle" if judge.startswith("oracle") else judge
    if judge == "oracle":
        return {"method": "rag", "k1": WHOLE_BANK, "k2": WHOLE_BANK, "threshold": -1.0}, {"chooser": chooser,
                                                                                           "show": k2}
    return {"method": "rag", "k1": k1, "k2": k1, "threshold": threshold}, {"chooser": chooser, "show": k2}


def pick(chooser: str, memories: list[dict[str, Any]], show: int,
         utility: Callable[[dict[str, Any]], int]) -> list[dict[str, Any]]:
    """The `show` memories a chooser (`CHOOSERS`) picks among `memories` (in the harness's order): `oracle` the
    useful ones (`utility` 1), newest first; `no-failures` the first ones not from a failed episode; `newest`."""
    if chooser == "oracle":
        return sorted((m for m in memories if utility(m) == 1), key=lambda m: -m["id"])[:show]
    if chooser == "no-failures":
        return [m for m in memories if m.get("outcome") != "failure"][:show]
    if chooser == "newest":
        return sorted(memories, key=lambda m: -m["id"])[:show]
    raise ValueError(f"unknown chooser {chooser!r}; choose one of {', '.join(CHOOSERS)}")
