"""ALFWorld's few-shot examples: one worked dialogue per task type, from a file or built from walkthroughs.

A file in the MemRL authors' format is a JSON list of {"task": TYPE, "example": [chat messages]}.
Without one, each type's example is its first training game played by its gold walkthrough, with
templated thoughts; the result is cached on disk (keyed by the data directory and the format
version) and built by one process at a time.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path

from memrl_bench.adapters.alfworld.data import SHORT_TYPES, cache_dir, list_games, load_walkthrough, strip_banner
from memrl_bench.adapters.alfworld.game import GameEnv
from memrl_cli.errors import MemrlError

EXAMPLES_FORMAT_VERSION = 1

# Short task-type plans for the opening thought of examples built from walkthroughs.
_PLANS = {
    "put": "find the object, take it, and move it to the target receptacle",
    "clean": "find the object, take it, clean it with the sinkbasin, and move it to the target receptacle",
    "heat": "find the object, take it, heat it with the microwave, and move it to the target receptacle",
    "cool": "find the object, take it, cool it with the fridge, and move it to the target receptacle",
    "examine": "find the object, take it, and look at it under a lamp by using the lamp",
    "puttwo": "find the first object and move it to the target receptacle, then find the second one and move it there too",
}


def load_examples_file(path: Path) -> dict[str, list[dict[str, str]]]:
    """Few-shot examples from a JSON list of {"task": TYPE, "example": [{"role", "content"}, ...]}."""
    try:
        items = json.loads(path.read_text())
        examples = {item["task"]: [{"role": m["role"], "content": m["content"]} for m in item["example"]] for item in items}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise MemrlError(
            f"cannot read ALFWorld examples from {path} ({error}): expected a JSON list of "
            '{"task": "put|clean|heat|cool|examine|puttwo", "example": [{"role": ..., "content": ...}, ...]}'
        ) from error
    for task_type, example in examples.items():
        if task_type not in SHORT_TYPES:
            raise MemrlError(f"{path}: unknown task type {task_type!r}; use {', '.join(SHORT_TYPES)}")
        if not example or example[0]["role"] != "user":
            raise MemrlError(f"{path}: the {task_type!r} example must start with a user message (the task)")
    return examples


def cached_walkthrough_examples(root: Path) -> dict[str, list[dict[str, str]]]:
    """Examples built from training walkthroughs, cached on disk (one builder at a time, others wait)."""
    train_dir = root / "json_2.1.1" / "train"
    stamp = f"{EXAMPLES_FORMAT_VERSION}:{root}:{train_dir.stat().st_mtime_ns if train_dir.is_dir() else 0}"
    path = cache_dir() / f"examples-{hashlib.sha256(stamp.encode()).hexdigest()[:16]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.is_file():
            items = [{"task": t, "example": e} for t, e in build_walkthrough_examples(root).items()]
            staging = path.with_suffix(f".{os.getpid()}.tmp")
            staging.write_text(json.dumps(items, indent=1))
            staging.replace(path)
    return load_examples_file(path)


def build_walkthrough_examples(root: Path) -> dict[str, list[dict[str, str]]]:
    """One Thought/Action dialogue per task type: the first training game of that type, played by its walkthrough."""
    games = list_games(root, "train")
    examples: dict[str, list[dict[str, str]]] = {}
    for task_type in SHORT_TYPES:
        game = next((g for g in games if g.task_type == task_type), None)
        if game is None:
            raise MemrlError(f"no {task_type!r} game in {root}/json_2.1.1/train to build an example from: pass examples=FILE")
        examples[task_type] = _example_dialogue(game.path, task_type)
    return examples


def _example_dialogue(game_path: str, task_type: str) -> list[dict[str, str]]:
    dialogue: list[dict[str, str]] = []
    won = False
    with GameEnv(game_path) as env:
        dialogue.append({"role": "user", "content": strip_banner(env.reset())})
        walkthrough = load_walkthrough(game_path)
        for index, action in enumerate(walkthrough):
            thought = _thought(action)
            if index == 0:
                thought = f"To solve the task, I need to {_PLANS[task_type]}. {thought}"
            dialogue.append({"role": "assistant", "content": f"Thought: {thought}\nAction: {action}"})
            observation, won = env.step(action)
            if won:
                break
            dialogue.append({"role": "user", "content": f"Observation: {observation}"})
    if not won:
        raise MemrlError(f"the walkthrough of {game_path} does not win its game: the data is not ALFWorld 2.1.3")
    return dialogue


def _thought(action: str) -> str:
    """A short templated thought for a walkthrough command."""
    verb, _, rest = action.partition(" ")
    if action.startswith("go to "):
        return f"Next I go to {action[6:]}."
    if verb == "take":
        obj, _, recep = rest.partition(" from ")
        return f"I take {obj} from {recep}."
    if verb == "move":
        obj, _, recep = rest.partition(" to ")
        return f"Now I move {obj} to {recep}."
    if verb in ("open", "close"):
        return f"I {verb} {rest}."
    if verb == "use":
        return f"I turn on {rest} to look at the object under it."
    if verb in ("clean", "heat", "cool"):
        obj, _, recep = rest.partition(" with ")
        return f"I {verb} {obj} with {recep}."
    return f"I {action}."
