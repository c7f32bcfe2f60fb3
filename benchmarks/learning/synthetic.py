"""A synthetic testbed with known answers: a task stream and a scripted agent, no LLM.

Every task has a hidden kind; every memory is the trajectory of one episode and names the task
it came from and whether that episode passed, so the true utility of every (task, memory) pair is
known (`utility`). The agent succeeds with probability `p_good` when a useful memory is among
those shown, `p_trap` (0) when a misleading one is, and `p0` otherwise. Its luck is drawn per
attempt (`luck="attempt"`, the default): a uniform number fixed by the luck seed and the episode's
place in the stream (the harness's episode seed), never by what is shown, so every method gets the
same draws (common random numbers) and runs resume with identical metrics. `luck="prompt"` is the
older diagnostic: a hash of the task and the memories shown (the same prompt always repeats its
outcome, so only a method that reshuffles its prompt gets a new draw).

The `heldout` split (the paper's transfer setting) asks every training task's kind in other words,
so a memory useful for a training task is useful for its held-out paraphrase.

Scenarios (see docs/learning.md):

* `a` query-specific: a memory helps only its own task (a passed episode of the same intent);
* `b` generic: a passed episode helps every task of its kind;
* `c` traps: each task has a look-alike twin of another kind whose passed episode misleads,
  while a less similar task of its own kind helps;
* `d` noisy rewards: `a` with luck p0 = 0.3 and failure despite a useful memory (p_good = 0.7);
* `e` heavy repetition: few intents, each asked several times per epoch (as in ALFWorld).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from memrl_bench.framework.protocol import LLM, Episode, Task

OBJECTS = ["apple", "mug", "towel", "lamp", "book", "plate", "knife", "pillow", "candle", "bowl", "spoon", "vase"]
ACTIONS = ["heat", "cool", "clean", "slice", "hide", "stack"]
PLACES = ["drawer", "cabinet", "shelf", "table"]
SCENARIOS = {  # name → (p0, p_good)
    "a": (0.1, 0.9), "b": (0.1, 0.9), "c": (0.1, 0.9), "d": (0.3, 0.7), "e": (0.1, 0.9),
}
LUCKS = ("attempt", "prompt")
MEMORY = re.compile(r"episode of (\S+) \(kind (\S+)\): (PASS|FAIL)")


def _heldout(tasks: list[Task]) -> list[Task]:
    """Each distinct training intent once more, in other words ("put the X in the Y" → "place the X into the Y"),
    with its kind: the transfer split."""
    seen: dict[str, Task] = {}
    for t in tasks:
        seen.setdefault(t.meta["kind"] + t.query, t)
    return [Task(f"{t.id}:heldout", "please " + t.query.replace("put ", "place ").replace(" in the ", " into the ")
                 .replace(" and ", " then ").replace(", then ", " and afterwards "), meta=dict(t.meta))
            for t in seen.values()]


def _tasks(scenario: str) -> list[Task]:
    """The training stream of a scenario: ids, intents and hidden kinds."""
    tasks: list[Task] = []
    if scenario in ("a", "d"):  # 24 distinct intents in look-alike families
        for i in range(24):
            obj, place = OBJECTS[i % 12], PLACES[i // 12]
            tasks.append(Task(f"{scenario}{i}", f"put the {obj} in the {place} {i % 3 + 1}", meta={"kind": f"t{i}"}))
    elif scenario == "b":  # 6 kinds × 4 tasks; a kind is an action
        for i in range(24):
            action, obj = ACTIONS[i % 6], OBJECTS[i // 6 * 3 + i % 3]
            tasks.append(Task(f"b{i}", f"{action} the {obj} and put it on the table", meta={"kind": action}))
    elif scenario == "c":  # twins: same words, another kind; kin: other words, same kind
        for i in range(12):
            action, obj = ACTIONS[i % 6], OBJECTS[i]
            for twin, place in enumerate(("drawer", "cabinet")):
                kind = f"{action}-{twin}"
                tasks.append(Task(f"c{i}-{twin}", f"{action} the {obj}, then open the {place}", meta={"kind": kind}))
    elif scenario == "e":  # 6 intents × 4 repeats per epoch, interleaved
        for rep in range(4):
            for i in range(6):
                tasks.append(Task(f"e{i}-r{rep}", f"put the {OBJECTS[i]} in the {PLACES[i % 4]} {i % 3 + 1}",
                                  meta={"kind": f"t{i}"}))
    else:
        raise ValueError(f"unknown scenario {scenario!r}; choose one of {', '.join(SCENARIOS)}")
    return tasks


def utility(scenario: str, task: Task, memory_text: str) -> int:
    """True utility of a memory for a task: 1 useful, -1 misleading (a trap), 0 neutral."""
    found = MEMORY.search(memory_text)
    if not found or found.group(3) != "PASS":
        return 0
    source, kind = found.group(1), found.group(2)
    if kind == task.meta["kind"]:  # kinds: one intent in a, d, e; an action in b; action and twin side in c
        return 1
    is_twin = scenario == "c" and source.split("-")[0] == task.id.split("-")[0]
    return -1 if is_twin else 0


class Synthetic:
    """One scenario's task stream and its scripted agent (`uses_llm = False`)."""

    name = "synthetic"
    train_split = "train"
    eval_splits: tuple[str, ...] = ("heldout",)
    uses_llm = False
    thread_safe = True  # run_episode is a pure function of its arguments
    takes_seed = True  # the harness passes each episode's seed: luck per attempt, the same for every method

    def __init__(self, data: str | None = None, limit: int | None = None, scenario: str = "a",
                 luck_seed: int = 0, luck: str = "attempt") -> None:
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}; choose one of {', '.join(SCENARIOS)}")
        if luck not in LUCKS:
            raise ValueError(f"unknown luck {luck!r}; choose one of {', '.join(LUCKS)}")
        self.scenario = scenario
        self.p0, self.p_good = SCENARIOS[scenario]
        self.luck_seed = luck_seed
        self.luck_mode = luck

    def tasks(self, split: str) -> list[Task]:
        train = _tasks(self.scenario)
        return train if split == "train" else _heldout(train) if split == "heldout" else []

    def luck(self, task: Task, memories: list[dict[str, Any]], seed: int | None = None) -> float:
        """A uniform number in [0, 1): per attempt, fixed by the luck seed and the episode's `seed` (its place
        in the stream); with `luck="prompt"` (a diagnostic), by the task and the memories shown."""
        if self.luck_mode == "attempt":
            if seed is None:
                raise ValueError("luck per attempt needs the episode's seed (the harness passes it: takes_seed)")
            key = f"{self.luck_seed}/attempt/{seed}"
        else:
            key = f"{self.luck_seed}/{task.id}/{','.join(str(m['id']) for m in memories)}"
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") / 2.0 ** 64

    def run_episode(self, task: Task, memories: list[dict[str, Any]], llm: LLM, seed: int | None = None) -> Episode:
        utilities = [utility(self.scenario, task, m["experience"]) for m in memories]
        p = 0.0 if -1 in utilities else self.p_good if 1 in utilities else self.p0
        draw = self.luck(task, memories, seed)
        ok = draw < p
        status = "PASS" if ok else "FAIL"
        trajectory = f"episode of {task.id} (kind {task.meta['kind']}): {status}; shown {[m['id'] for m in memories]}"
        return Episode(success=ok, steps=1, trajectory=trajectory, status=status,
                       info={"useful_shown": 1 in utilities, "trap_shown": -1 in utilities, "luck": draw})

    def close(self) -> None:
        pass
