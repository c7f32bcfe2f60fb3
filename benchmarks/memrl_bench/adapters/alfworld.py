"""ALFWorld (TextWorld household games) played by a ReAct agent with memories in its prompt.

One episode is one game: a fresh single-game TextWorld environment built like ALFWorld's
official `AlfredTWEnv` (PDDL backend, `AlfredDemangler(shuffle=False)`, `AlfredInfos`), so
observations and the set of valid commands are the official ones. The agent answers
"Thought: ...\\nAction: ..." for at most `max_steps` turns; the episode succeeds when the game
is won. The prompt follows the MemRL authors' layout (system prompt, one worked example of the
task's type, a memory block, then the new task). See docs/alfworld.md.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

from memrl_bench.adapters.alfworld_data import (
    SHORT_TYPES,
    cache_dir,
    list_games,
    load_walkthrough,
    parse_task_types,
    resolve_data_dir,
    strip_banner,
)
from memrl_bench.framework.protocol import LLM, Episode, Task, delimited_memories
from memrl_cli.errors import MemrlError

SYSTEM_PROMPT = """You are an agent in a household environment and must complete a task by interacting with it. First you get a description of the room and your goal. After each of your turns you get the observation that your last action produced.

In every turn, think about the current situation and plan what to do next, then give exactly one action. Your output must strictly follow this format:
Thought: <your thoughts>
Action: <your next action>

The available actions are:
1. go to {recep}
2. take {obj} from {recep}
3. move {obj} to {recep}
4. open {recep}
5. close {recep}
6. use {obj}
7. clean {obj} with {recep}
8. heat {obj} with {recep}
9. cool {obj} with {recep}
where {obj} and {recep} are objects and receptacles as the observations name them (e.g. "apple 1", "countertop 2").
If the environment answers "Nothing happens.", your action was invalid: try something else."""

EXAMPLE_PREFIX = "Here is an example of how to solve the task:\n"
TURN_PREFIX = "Now, it's your turn to solve a new task.\n"
MEMORY_INTRO = (
    "In addition to the example, here are memories of similar tasks from your past attempts. "
    "Each has a task, a script or reflection, and the trajectory of that attempt."
)
MEMORY_SECTIONS = (
    ("success", "--- SUCCESSFUL MEMORIES (Examples to follow) ---"),
    ("failure", "--- FAILED MEMORIES (Examples to avoid or learn from) ---"),
    ("unknown", "--- OTHER MEMORIES (outcome unknown) ---"),
)
INVALID_ACTION = "Nothing happens."
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


class AlfworldBenchmark:
    """ALFWorld adapter: games of `json_2.1.1/<split>`, a ReAct agent, success = game won.

    Options: `task_types` (short names put, clean, heat, cool, examine, puttwo, official names,
    or 1-6; list or comma-separated), `max_steps` (agent turns per episode, default 30),
    `train_split` (the learning stream, default `train`; e.g. `valid_unseen` for a quick run) and
    `examples` (a JSON file of few-shot examples in the MemRL authors' format, a list of
    {"task": TYPE, "example": [chat messages]}; default: built from training walkthroughs).
    """

    name = "alfworld"
    train_split = "train"
    eval_splits = ("valid_seen", "valid_unseen")
    thread_safe = True  # episodes may run on several threads at once (GameEnv serialises TextWorld)

    def __init__(
        self,
        data: str | None = None,
        limit: int | None = None,
        task_types: str | list[Any] | None = None,
        max_steps: int = 30,
        examples: str | None = None,
        train_split: str = "train",
        **options: Any,
    ) -> None:
        if options:
            raise MemrlError(
                f"unknown ALFWorld option(s) {', '.join(sorted(options))}: "
                "use task_types, max_steps, examples or train_split"
            )
        splits = ("train", "valid_seen", "valid_unseen", "valid_train")
        if train_split not in splits:
            raise MemrlError(f"train_split must be one of {', '.join(splits)}, got {train_split!r}")
        self.train_split = train_split
        self.root = resolve_data_dir(data)
        self.limit = None if limit is None else int(limit)
        self.task_types = parse_task_types(task_types)
        self.max_steps = int(max_steps)
        if self.max_steps < 1:
            raise MemrlError(f"max_steps must be at least 1, got {max_steps}")
        self._examples: dict[str, list[dict[str, str]]] | None = None
        if examples is not None:
            self._examples = load_examples_file(Path(examples).expanduser())
            missing = [t for t in self.task_types if t not in self._examples]
            if missing:
                raise MemrlError(f"{examples} has no example for task type(s) {', '.join(missing)}: add them or filter task_types")

    def tasks(self, split: str) -> list[Task]:
        """The split's games (sorted by id), filtered by task type, then cut to `limit`."""
        games = list_games(self.root, split, self.task_types)
        if self.limit is not None:
            games = games[: self.limit]
        return [
            Task(id=g.id, query=g.intent, payload=g.path, meta={"task_type": g.task_type, "split": split})
            for g in games
        ]

    def examples(self) -> dict[str, list[dict[str, str]]]:
        """One few-shot dialogue per task type (from the `examples` file, else built and cached)."""
        if self._examples is None:
            self._examples = cached_walkthrough_examples(self.root)
        return self._examples

    def build_messages(self, task_text: str, task_type: str, memories: list[dict[str, Any]]) -> list[dict[str, str]]:
        """The opening prompt: system prompt, the type's example, the memory block, the new task."""
        example = self.examples().get(task_type)
        if not example:
            raise MemrlError(f"the few-shot examples have no {task_type!r} example: add one to the examples file")
        messages = [{"role": "system", "content": SYSTEM_PROMPT}]
        for index, message in enumerate(example):
            content = message["content"]
            if index == 0:
                content = EXAMPLE_PREFIX + content
            messages.append({"role": message["role"], "content": content})
        block = memory_block(memories)
        if block:
            messages.append({"role": "system", "content": block})
        messages.append({"role": "user", "content": TURN_PREFIX + task_text})
        return messages

    def run_episode(self, task: Task, memories: list[dict[str, Any]], llm: LLM) -> Episode:
        """Play the task's game with a ReAct agent for at most `max_steps` turns."""
        transcript: list[str] = []
        steps = 0
        invalid = 0
        try:
            env = GameEnv(task.payload)
        except MemrlError:
            raise
        except Exception as error:  # noqa: BLE001 - any failure to start the game is an environment error
            return _env_error(error, steps, transcript)
        with env:
            try:
                task_text = strip_banner(env.reset())
            except Exception as error:  # noqa: BLE001
                return _env_error(error, steps, transcript)
            transcript.append(task_text)
            messages = self.build_messages(task_text, task.meta["task_type"], memories)
            won = False
            while steps < self.max_steps and not won:
                reply = llm.chat(messages) or ""
                messages.append({"role": "assistant", "content": reply})
                action = parse_action(reply)
                steps += 1
                transcript.append(_agent_turn(reply, action))
                try:
                    observation, won = env.step(action)
                except Exception as error:  # noqa: BLE001
                    return _env_error(error, steps, transcript)
                invalid += observation == INVALID_ACTION
                transcript.append(f"Observation: {observation}")
                messages.append({"role": "user", "content": f"Observation: {observation}"})
        return Episode(
            success=won,
            steps=steps,
            trajectory="\n".join(transcript),
            status="PASS" if won else "FAIL",
            info={"invalid_actions": invalid, "intent_matches": task_text == task.query},
        )

    def close(self) -> None:
        """Nothing to release: each episode opens and closes its own game."""


# TextWorld's PDDL games are not thread-safe: building a game state runs fast-downward's translator, which sets
# module-level options and swaps sys.stdout (threads playing games at once end in IndexErrors). Each game has its own
# copy of the planner library, so games may interleave: every TextWorld call of this process holds this lock.
_TEXTWORLD = threading.Lock()


class GameEnv:
    """One ALFWorld game in TextWorld, wrapped as the official `AlfredTWEnv` wraps its games.

    Thread-safe: games on several threads take turns, one TextWorld call at a time per process.
    """

    def __init__(self, game_path: str) -> None:
        with _TEXTWORLD:
            textworld, generic_environment, filter_wrapper, demangler, infos_wrapper = _textworld_parts()
            request = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
            env = generic_environment(request)
            for wrapper in (demangler(shuffle=False), infos_wrapper, filter_wrapper):
                env = wrapper(env)
            env.load(game_path)
        self._env = env

    def reset(self) -> str:
        """Start the game; return the initial observation (with the welcome banner)."""
        with _TEXTWORLD:
            observation, _infos = self._env.reset()
        return str(observation)

    def step(self, action: str) -> tuple[str, bool]:
        """Apply one command; return the observation and whether the game is won."""
        with _TEXTWORLD:
            observation, _score, _done, infos = self._env.step(action)
        return str(observation), bool(infos["won"])

    def close(self) -> None:
        """Release the game."""
        with _TEXTWORLD:
            self._env.close()

    def __enter__(self) -> GameEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _textworld_parts() -> tuple[Any, Any, Any, Any, Any]:
    """Import TextWorld and ALFWorld's wrappers (slow, ~3-5 s, once per process), keeping $ALFWORLD_DATA.

    Importing ALFWorld sets $ALFWORLD_DATA to ~/.cache/alfworld when unset; undo that so data
    resolution in this process keeps depending on what the user set.
    """
    before = os.environ.get("ALFWORLD_DATA")
    try:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        from textworld.envs.wrappers import Filter, GenericEnvironment
    except ImportError as error:
        raise MemrlError(
            f"ALFWorld is not installed ({error}): run `pip install alfworld==0.4.2` (needs g++ and cmake)"
        ) from error
    finally:
        if before is None:
            os.environ.pop("ALFWORLD_DATA", None)
        else:
            os.environ["ALFWORLD_DATA"] = before
    return textworld, GenericEnvironment, Filter, AlfredDemangler, AlfredInfos


def parse_action(reply: str) -> str:
    """The command in a reply: the first line after its last "Action:"; `look` for an empty reply."""
    text = reply.strip()
    if "Action:" in text:
        text = text.rsplit("Action:", 1)[1].strip()
    text = text.splitlines()[0].strip() if text else ""
    return text or "look"


def _agent_turn(reply: str, action: str) -> str:
    """An agent turn for the trajectory: the reply's lines prefixed with "> " (or the fallback action)."""
    if not reply.strip():
        return f"> Action: {action}"
    return "\n".join(f"> {line}" for line in reply.strip().splitlines())


def _env_error(error: BaseException, steps: int, transcript: list[str]) -> Episode:
    return Episode(
        success=False,
        steps=steps,
        trajectory="\n".join(transcript),
        status="ENV_ERROR",
        env_error=True,
        info={"error": f"{type(error).__name__}: {error}"},
    )


def memory_block(memories: list[dict[str, Any]]) -> str:
    """The system message that shows retrieved memories, grouped by outcome, in full ("" if none)."""
    if not memories:
        return ""
    parts = [MEMORY_INTRO]
    for outcome, title in MEMORY_SECTIONS:
        group = [m for m in memories if _outcome(m) == outcome]
        if not group:
            continue
        parts.append(title)
        for number, memory in enumerate(group, 1):
            parts.append(f"Memory {number}\nTask: {memory.get('intent', '').strip()}\n{memory.get('experience', '').strip()}")
    return delimited_memories("\n\n".join(parts))


def _outcome(memory: dict[str, Any]) -> str:
    outcome = memory.get("outcome")
    return outcome if outcome in ("success", "failure") else "unknown"


def replay_walkthrough(task: Task) -> Episode:
    """Play the game's gold walkthrough in the episode environment (the harness-free floor).

    `info` holds the environment's own timings: `reset_seconds` and `step_seconds` (total).
    """
    walkthrough = load_walkthrough(task.payload)
    transcript: list[str] = []
    steps = 0
    won = False
    started = time.perf_counter()
    try:
        with GameEnv(task.payload) as env:
            transcript.append(strip_banner(env.reset()))
            reset_seconds = time.perf_counter() - started
            for action in walkthrough:
                observation, won = env.step(action)
                steps += 1
                transcript += [f"> Action: {action}", f"Observation: {observation}"]
                if won:
                    break
    except MemrlError:
        raise
    except Exception as error:  # noqa: BLE001
        return _env_error(error, steps, transcript)
    step_seconds = time.perf_counter() - started - reset_seconds
    return Episode(
        success=won,
        steps=steps,
        trajectory="\n".join(transcript),
        status="PASS" if won else "FAIL",
        info={"reset_seconds": reset_seconds, "step_seconds": step_seconds},
    )


def walkthrough_responder(tasks: list[Task], thought: str = "I follow the plan that solves this task.") -> Callable[[dict[str, Any]], str]:
    """A chat responder that plays each task's gold walkthrough (for scripted-LLM tests and benchmarks).

    It finds the task in the request's last "Now, it's your turn" message, counts the assistant
    turns after it, and answers with the next walkthrough command (then `look`).
    """
    plans = {task.query: load_walkthrough(task.payload) for task in tasks}

    def respond(request: dict[str, Any]) -> str:
        messages = request["messages"]
        start = max(i for i, m in enumerate(messages) if m["role"] == "user" and m["content"].startswith(TURN_PREFIX))
        plan = plans[messages[start]["content"][len(TURN_PREFIX) :]]
        done = sum(1 for m in messages[start + 1 :] if m["role"] == "assistant")
        return f"Thought: {thought}\nAction: {plan[done] if done < len(plan) else 'look'}"

    return respond


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
