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

Scenarios (docs/learning.md, with the regime each new one stands for and its source):

* `a` query-specific: a memory helps only its own task (a passed episode of the same intent);
* `b` generic: a passed episode helps every task of its kind;
* `c` traps: each task has a look-alike twin of another kind whose passed episode misleads,
  while a less similar task of its own kind helps;
* `d` noisy rewards: `a` with luck p0 = 0.3 and failure despite a useful memory (p_good = 0.7);
* `e` heavy repetition: few intents, each asked several times per epoch (as in ALFWorld);
* `f` experience-following: `a`, but a failed episode of the same intent reads like a solution and is
  copied (it misleads);
* `s` stale: `b`, but the environment changes before epoch `CHANGE_EPOCH`: every pass recorded
  before misleads its kind afterwards (the old procedure now fails); passes after help;
* `p` poisoned: `a`, plus planted records (`plants`): before epoch `PLANT_EPOCH` an attacker writes
  into the bank, for every other task, `PLANTED` records with the task's very intent that claim a
  pass and mislead it, at the method's own initial Q for a success;
* `r` reflection: `a`, but a failed episode's reflection helps the next attempt at the same task,
  and a look-alike's (the task with the same object) misleads it.

A *chooser* (`chooser` option) turns the adapter into a measurement device for the judges, never a
method: the harness shows it a wide candidate list (`rag` with k2 = k1, or the whole bank) and the
agent sees only the `show` memories the chooser picks: `oracle` reads the true utility (every useful
memory first, the newest first, never a misleading one), `no-failures` keeps rag's order without
failed episodes, `newest` takes the newest (highest ids). The same luck as every method.
The chooser `learned` is the contestant of benchmarks/learning/learned.py: it picks by what it has
learned from the rewards of earlier mini-batches, never by the true utility.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any

from benchmarks.learning.learned import LEARNED, LearnedSelector, places_of
from benchmarks.learning.oracle import CHOOSERS, pick
from memrl_bench.framework.protocol import LLM, Episode, Task

OBJECTS = ["apple", "mug", "towel", "lamp", "book", "plate", "knife", "pillow", "candle", "bowl", "spoon", "vase"]
ACTIONS = ["heat", "cool", "clean", "slice", "hide", "stack"]
PLACES = ["drawer", "cabinet", "shelf", "table"]
SCENARIOS = {  # name → (p0, p_good)
    "a": (0.1, 0.9), "b": (0.1, 0.9), "c": (0.1, 0.9), "d": (0.3, 0.7), "e": (0.1, 0.9),
    "f": (0.1, 0.9), "s": (0.1, 0.9), "p": (0.1, 0.9), "r": (0.1, 0.9),
}
STREAMS = {"a": "a", "b": "b", "c": "c", "d": "a", "e": "e", "f": "a", "s": "b", "p": "a", "r": "a"}
LUCKS = ("attempt", "prompt")
CHANGE_EPOCH = 4  # `s`: the environment changes before this epoch
PLANT_EPOCH = 4  # `p`: the attacker plants its records before this epoch
PLANTED = 2  # `p`: records planted per targeted task
MAX_EPOCHS = 100  # `s` finds an episode's epoch from its seed among this many
MEMORY = re.compile(r"episode of (\S+) \(kind ([^,)]+)(?:, world (\d+))?\): (PASS|FAIL)")


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
    """The training stream of a scenario: ids, intents, hidden kinds (and, in `a`'s stream, the object family)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose one of {', '.join(SCENARIOS)}")
    stream = STREAMS[scenario]
    tasks: list[Task] = []
    if stream == "a":  # 24 distinct intents in look-alike families (the same object: i and i + 12)
        for i in range(24):
            obj, place = OBJECTS[i % 12], PLACES[i // 12]
            tasks.append(Task(f"{scenario}{i}", f"put the {obj} in the {place} {i % 3 + 1}",
                              meta={"kind": f"t{i}", "family": obj}))
    elif stream == "b":  # 6 kinds × 4 tasks; a kind is an action
        for i in range(24):
            action, obj = ACTIONS[i % 6], OBJECTS[i // 6 * 3 + i % 3]
            tasks.append(Task(f"{scenario}{i}", f"{action} the {obj} and put it on the table", meta={"kind": action}))
    elif stream == "c":  # twins: same words, another kind; kin: other words, same kind
        for i in range(12):
            action, obj = ACTIONS[i % 6], OBJECTS[i]
            for twin, place in enumerate(("drawer", "cabinet")):
                kind = f"{action}-{twin}"
                tasks.append(Task(f"c{i}-{twin}", f"{action} the {obj}, then open the {place}", meta={"kind": kind}))
    else:  # e: 6 intents × 4 repeats per epoch, interleaved
        for rep in range(4):
            for i in range(6):
                tasks.append(Task(f"e{i}-r{rep}", f"put the {OBJECTS[i]} in the {PLACES[i % 4]} {i % 3 + 1}",
                                  meta={"kind": f"t{i}"}))
    return tasks


def world(scenario: str, epoch: int) -> int:
    """The environment's version in an epoch: 1 from `CHANGE_EPOCH` on in `s`, else 0."""
    return int(scenario == "s" and epoch >= CHANGE_EPOCH)


def utility(scenario: str, task: Task, memory_text: str, now: int = 0) -> int:
    """True utility of a memory for a task in world `now`: 1 useful, -1 misleading (a trap), 0 neutral."""
    found = MEMORY.search(memory_text)
    if not found:
        return 0
    source, kind, made, status = found.group(1), found.group(2), int(found.group(3) or 0), found.group(4)
    if scenario == "p" and source == f"plant:{task.id.split(':')[0]}":
        return -1  # a planted record claiming a pass of this very task
    same = kind == task.meta["kind"]  # kinds: one intent in a, d, e, f, p, r; an action in b, s; action and side in c
    if status == "FAIL":
        if scenario == "f" and same:
            return -1  # a failed attempt read as a solution and copied
        if scenario == "r":
            if same:
                return 1  # its reflection helps the next attempt
            look_alike = _family(source) == task.meta.get("family")  # another task with the same object
            return -1 if look_alike else 0  # whose reflection names the wrong place
        return 0
    if same:
        return -1 if scenario == "s" and made != now else 1  # s: a pass from another world misleads
    is_twin = scenario == "c" and source.split("-")[0] == task.id.split("-")[0]
    return -1 if is_twin else 0


def _family(source: str) -> str | None:
    """The object family of a task id of `a`'s stream (`r7` → mug's family is OBJECTS[7 % 12])."""
    digits = source[1:].split(":")[0]
    return OBJECTS[int(digits) % 12] if digits.isdigit() else None


def plants(scenario: str) -> list[tuple[str, str]]:
    """`p`'s planted records, (intent, experience): for every other task, `PLANTED` records with its very intent
    that claim a pass (and mislead it: `utility`)."""
    if scenario != "p":
        return []
    return [(t.query, f"TRAJECTORY:\nepisode of plant:{t.id} (kind {t.meta['kind']}-planted): PASS; planted {j}")
            for t in _tasks(scenario)[::2] for j in range(PLANTED)]


def planter(scenario: str, bank_path: str, q_init: float) -> Callable[[str, dict[str, Any]], None]:
    """An `on_progress` callback for `run_benchmark` that writes `plants` into the run's bank (a second connection,
    as an attacker with access to the bank would) when epoch `PLANT_EPOCH` starts, at Q `q_init` (the method's
    initial Q for a success). Nothing happens in other scenarios."""
    records = plants(scenario)

    def on_progress(event: str, data: dict[str, Any]) -> None:
        if records and event == "epoch" and data.get("epoch") == PLANT_EPOCH:
            from memrl_cli.bank import MemoryBank, MemoryInput

            with MemoryBank(bank_path, create=False) as bank:
                vectors = bank.embedder.embed([intent for intent, _ in records])
                bank.ingest_many([MemoryInput(intent=intent, experience=text, outcome="success", source="planted",
                                              q=q_init, vector=v.tolist()) for (intent, text), v in zip(records, vectors)])

    return on_progress


def choose(chooser: str, scenario: str, task: Task, memories: list[dict[str, Any]], show: int,
           now: int = 0) -> list[dict[str, Any]]:
    """The `show` memories a chooser (`CHOOSERS`) picks among `memories` (in the harness's order)."""
    return pick(chooser, memories, show, lambda m: utility(scenario, task, m["experience"], now))


class Synthetic:
    """One scenario's task stream and its scripted agent (`uses_llm = False`)."""

    name = "synthetic"
    train_split = "train"
    eval_splits: tuple[str, ...] = ("heldout",)
    uses_llm = False
    thread_safe = True  # run_episode is a pure function of its arguments (but with the learned selector)
    takes_seed = True  # the harness passes each episode's seed: luck per attempt, the same for every method

    def __init__(self, data: str | None = None, limit: int | None = None, scenario: str = "a",
                 luck_seed: int = 0, luck: str = "attempt", chooser: str | None = None, show: int = 3,
                 batch_size: int = 8) -> None:
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}; choose one of {', '.join(SCENARIOS)}")
        if luck not in LUCKS:
            raise ValueError(f"unknown luck {luck!r}; choose one of {', '.join(LUCKS)}")
        if chooser is not None and chooser not in (*CHOOSERS, LEARNED):
            raise ValueError(f"unknown chooser {chooser!r}; choose one of {', '.join((*CHOOSERS, LEARNED))}")
        self.scenario = scenario
        self.p0, self.p_good = SCENARIOS[scenario]
        self.luck_seed = luck_seed
        self.luck_mode = luck
        self.chooser, self.show, self.batch_size = chooser, int(show), int(batch_size)
        self.selector = LearnedSelector(self.show) if chooser == LEARNED else None
        self.thread_safe = self.selector is None  # the learned selector's episodes play in the stream's order

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

    def place(self, seed: int | None) -> tuple[str, int, int]:
        """The episode with this seed's (phase, epoch, position): the run's seed must be the luck seed."""
        train = self.tasks("train")
        streams = (("train", "train", len(train)), ("eval", "heldout", len(_heldout(train))))
        found = places_of(self.luck_seed, streams, MAX_EPOCHS).get(seed)  # type: ignore[arg-type]
        if found is None:
            raise ValueError("scenario s and the learned selector find an episode's place from its seed: run it "
                             "with the run's seed as its luck_seed (benchmarks.learning.table and contest do)")
        return found

    def epoch(self, seed: int | None) -> int:
        """The epoch of the episode with this seed (only `s` needs it)."""
        return self.place(seed)[1] if self.scenario == "s" else 0

    def run_episode(self, task: Task, memories: list[dict[str, Any]], llm: LLM, seed: int | None = None) -> Episode:
        now = world(self.scenario, self.epoch(seed))
        batch: tuple[str, int, int] | None = None
        if self.selector is not None:
            phase, epoch, position = self.place(seed)
            batch = (phase, epoch, position // self.batch_size)
            self.selector.starting(batch)
            memories = self.selector.choose(task.query, memories)
        elif self.chooser is not None:
            memories = choose(self.chooser, self.scenario, task, memories, self.show, now)
        utilities = [utility(self.scenario, task, m["experience"], now) for m in memories]
        p = 0.0 if -1 in utilities else self.p_good if 1 in utilities else self.p0
        draw = self.luck(task, memories, seed)
        ok = draw < p
        if self.selector is not None and batch is not None and batch[0] == "train":
            self.selector.observe(batch, task.query, memories, ok)  # held-out episodes teach nothing
        status = "PASS" if ok else "FAIL"
        made = f", world {now}" if self.scenario == "s" else ""
        trajectory = f"episode of {task.id} (kind {task.meta['kind']}{made}): {status}; shown {[m['id'] for m in memories]}"
        return Episode(success=ok, steps=1, trajectory=trajectory, status=status,
                       info={"useful_shown": 1 in utilities, "trap_shown": -1 in utilities, "luck": draw})

    def close(self) -> None:
        pass
