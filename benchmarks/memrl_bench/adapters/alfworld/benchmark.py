"""ALFWorld (TextWorld household games) played by a ReAct agent with memories in its prompt.

One episode is one game: a fresh single-game TextWorld environment built like ALFWorld's
official `AlfredTWEnv` (`alfworld_game.GameEnv`), so observations and the set of valid commands
are the official ones. The agent answers "Thought: ...\\nAction: ..." for at most `max_steps`
turns; the episode succeeds when the game is won. The prompt follows the MemRL authors' layout
(`alfworld_prompt`: system prompt, one worked example of the task's type from `alfworld_examples`,
a memory block, then the new task). Games and intents come from `alfworld_data`. See docs/alfworld.md.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memrl_bench.adapters.alfworld.data import list_games, parse_task_types, resolve_data_dir, strip_banner
from memrl_bench.adapters.alfworld.examples import cached_walkthrough_examples, load_examples_file
from memrl_bench.adapters.alfworld.game import INVALID_ACTION, GameEnv, env_error_episode
from memrl_bench.adapters.alfworld.prompt import opening_messages, parse_action
from memrl_bench.framework.protocol import LLM, Episode, Task
from memrl_cli.errors import MemrlError


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
        self._ready: dict[str, tuple[GameEnv, str]] = {}  # task id -> its game, reset, and the opening observation
        self._ready_lock = threading.Lock()
        if examples is not None:
            self._examples = load_examples_file(Path(examples).expanduser())
            missing = [t for t in self.task_types if t not in self._examples]
            if missing:
                raise MemrlError(f"{examples} has no example for task type(s) {', '.join(missing)}: add them or filter task_types")

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (adapters are): without the games this process prepared, which stay here."""
        return {**self.__dict__, "_ready": {}, "_ready_lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _ready_lock=threading.Lock())

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
        return opening_messages(example, task_text, memories)

    def prepare(self, task: Task, later: Callable[[], bool] = lambda: False) -> None:
        """Load and reset the task's game before its episode (any thread); its `run_episode` starts from it.
        While `later()`, it plays in a later batch and waits for the steps of the games in play. A game that fails
        to start is left alone: its episode starts it again and reports the error."""
        try:
            game = _start_game(task.payload, later)
        except Exception:  # noqa: BLE001 - reported by the episode, which starts the game again
            return
        with self._ready_lock:
            earlier = self._ready.pop(task.id, None)
            self._ready[task.id] = game
        if earlier is not None:
            earlier[0].close()

    def run_episode(self, task: Task, memories: list[dict[str, Any]], llm: LLM) -> Episode:
        """Play the task's game with a ReAct agent for at most `max_steps` turns."""
        transcript: list[str] = []
        steps = 0
        invalid = 0
        with self._ready_lock:
            prepared = self._ready.pop(task.id, None)
        try:
            env, opening = prepared or _start_game(task.payload)
        except MemrlError:
            raise
        except Exception as error:  # noqa: BLE001 - any failure to start the game is an environment error
            return env_error_episode(error, steps, transcript)
        with env:
            task_text = strip_banner(opening)
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
                    return env_error_episode(error, steps, transcript)
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
        """Close the games prepared and never played (each episode closes its own)."""
        with self._ready_lock:
            games, self._ready = list(self._ready.values()), {}
        for env, _opening in games:
            env.close()


def _start_game(path: str, later: Callable[[], bool] = lambda: False) -> tuple[GameEnv, str]:
    """The game at `path`, reset, and its opening observation (with the welcome banner)."""
    env = GameEnv(path, later)
    try:
        return env, env.reset()
    except BaseException:
        env.close()
        raise


def _agent_turn(reply: str, action: str) -> str:
    """An agent turn for the trajectory: the reply's lines prefixed with "> " (or the fallback action)."""
    if not reply.strip():
        return f"> Action: {action}"
    return "\n".join(f"> {line}" for line in reply.strip().splitlines())
