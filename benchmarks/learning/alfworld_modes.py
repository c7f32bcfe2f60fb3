"""The scripted ALFWorld agent's modes: which shown memories help or mislead it, and the judges' choosers.

A memory's true utility for a game (1 useful, -1 misleading, 0 neutral) follows from the agent's rule
in each mode (`MODES`); the agent wins when a useful memory is shown and no misleading one, fails when
a misleading one is shown, and otherwise wins by its luck (drawn per attempt, never from what is shown):

* `plain`: only the game's own script (its walkthrough as an `Actions:` line) helps; nothing misleads;
* `follow` (experience-following): the own script helps; the game's own failure note (the reflection
  of a failed attempt, which names the game and the actions it tried) misleads: the agent replays the
  tried actions; another game's script of the same task type (a look-alike's winning actions) misleads;
* `reflect` (reflection, as Reflexion): the own script and the game's own failure note both help.

In `follow` and `reflect` the agent's reflections carry the failure note (`failure_note`) and the
actions it tried; in `plain` they are the fixed text of `alfworld_scripted.REFLECTION`, as before.
"""

from __future__ import annotations

import hashlib
from typing import Any

from benchmarks.learning.oracle import pick
from memrl_bench.adapters.alfworld.data import load_walkthrough
from memrl_bench.framework.protocol import Task

MODES = ("plain", "follow", "reflect")
ACTIONS_PREFIX = "Actions: "
ACTION_SEPARATOR = " | "
FAILED_PREFIX = "Failed game: "
TRIED_PREFIX = "Tried: "


def actions_line(actions: list[str]) -> str:
    """How a script names the actions it played; the agent recognises a game's walkthrough by this line."""
    return ACTIONS_PREFIX + ACTION_SEPARATOR.join(actions)


def failure_note(query: str) -> str:
    """The line naming a game in the reflection of its failed attempt (a digest of its task text)."""
    return FAILED_PREFIX + hashlib.sha256(query.encode()).hexdigest()[:12]


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    return mode


class Rules:
    """The agent's knowledge of its games (walkthroughs, task types) and its rule in one mode."""

    def __init__(self, tasks: list[Task], mode: str = "plain") -> None:
        self.mode = check_mode(mode)
        self.plans = {t.query: load_walkthrough(t.payload) for t in tasks}
        self.keys = {query: actions_line(plan) for query, plan in self.plans.items()}
        self.types = {t.query: t.meta.get("task_type") for t in tasks}
        self.notes = {query: failure_note(query) for query in self.plans}
        self.lookalikes = {query: {self.keys[other] for other in self.plans
                                   if other != query and self.types[other] == self.types[query]}
                           for query in self.plans}

    def utility(self, query: str, text: str) -> int:
        """True utility of a memory (or of a whole shown block) for the game with task text `query`."""
        lines = set(text.splitlines())
        if self.mode == "follow" and (self.notes[query] in lines or lines & self.lookalikes[query]):
            return -1
        if self.keys[query] in lines or (self.mode == "reflect" and self.notes[query] in lines):
            return 1
        return 0

    def tried(self, query: str, text: str) -> list[str]:
        """The actions a shown failure note of this game says were tried ([] if none is shown)."""
        lines = text.splitlines()
        for index, line in enumerate(lines[:-1]):
            if line == self.notes[query] and lines[index + 1].startswith(TRIED_PREFIX):
                return [a for a in lines[index + 1][len(TRIED_PREFIX):].split(ACTION_SEPARATOR) if a]
        return []

    def reflection(self, query: str, played: list[str], plain_text: str) -> str:
        """The agent's reflection on a failed attempt: `plain_text`, plus the failure note outside `plain`."""
        if self.mode == "plain" or query not in self.notes:
            return plain_text
        return f"{plain_text}\n{self.notes[query]}\n{TRIED_PREFIX}{ACTION_SEPARATOR.join(played)}"

    def choose(self, chooser: str, query: str, memories: list[dict[str, Any]], show: int) -> list[dict[str, Any]]:
        """The `show` memories a judge's chooser picks (benchmarks/learning/oracle.py's `pick`)."""
        return pick(chooser, memories, show, lambda m: self.utility(query, m["experience"]))
