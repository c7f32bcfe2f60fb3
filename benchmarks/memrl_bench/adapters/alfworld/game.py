"""One ALFWorld game in TextWorld, wrapped as ALFWorld's official `AlfredTWEnv` wraps its games.

`GameEnv` builds a single-game environment (PDDL backend, `AlfredDemangler(shuffle=False)`,
`AlfredInfos`), so observations and the set of valid commands are the official ones, and whether
the game is won comes from the game itself, never from the agent's words. TextWorld and ALFWorld
are imported on the first game (slow, once per process).
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from memrl_bench.framework.protocol import Episode
from memrl_cli.errors import MemrlError

INVALID_ACTION = "Nothing happens."  # what the game answers to a command it cannot carry out

# TextWorld's PDDL games are not thread-safe: building a game state runs fast-downward's translator, which sets
# module-level options and swaps sys.stdout (threads playing games at once end in IndexErrors). Each game has its own
# copy of the planner library, so games may interleave: every TextWorld call of this process waits for its turn.
LOAD, STEP, LOAD_AHEAD = 0, 1, 2  # whose turn comes first: a game its episode waits for, a step, a game for later


class _Turns:
    """One holder at a time; of those waiting, the lowest rank goes first (FIFO is not promised within a rank).

    A batch ends when its last-loaded game has played its chain of LLM calls, so its games load before any step,
    and a game loaded ahead for the next batch waits for the steps of the games in play (docs/performance-harness.md).
    A rank is asked again while its caller waits (a game for later becomes one an episode waits for)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._held = False
        self._waiting = [0, 0, 0]

    @contextmanager
    def turn(self, rank: Callable[[], int]) -> Iterator[None]:
        acquired = False
        try:
            with self._changed:
                now = rank()
                self._waiting[now] += 1
                try:
                    while self._held or any(self._waiting[:now]):
                        self._changed.wait(0.1)  # (a rank may change without a release: look again)
                        asked = rank()
                        if asked != now:
                            self._waiting[now] -= 1
                            self._waiting[asked] += 1
                            now = asked
                            self._changed.notify_all()
                finally:  # also when the wait is interrupted: the ranks after it must not wait for it
                    self._waiting[now] -= 1
                    self._changed.notify_all()
                acquired = self._held = True
            yield
        finally:
            if acquired:
                with self._changed:
                    self._held = False
                    self._changed.notify_all()


_TEXTWORLD = _Turns()


@contextmanager
def _textworld_call(rank: Callable[[], int]) -> Iterator[None]:
    """A TextWorld call at its turn (`_Turns`), with Python's cyclic garbage collector paused during it.

    The translator allocates millions of small objects per game (loaded, then reset): at the default threshold the
    collector ran ~700 times per game, some of them over every object alive, so a game took 0.86 s of CPU alone
    and 2.3 s with 24 others open in the process. Paused (it resumes after the call): 0.48 and 1.03 s, the same
    peak memory (docs/performance-harness.md)."""
    with _TEXTWORLD.turn(rank):
        enabled = gc.isenabled()
        gc.disable()
        try:
            yield
        finally:
            if enabled:
                gc.enable()


class GameEnv:
    """One ALFWorld game in TextWorld, wrapped as the official `AlfredTWEnv` wraps its games.

    Thread-safe: games on several threads take turns, one TextWorld call at a time per process. `later()` says
    whether the game is loaded for a later batch (asked at each turn): loading and resetting it then wait for the
    steps of the games in play.
    """

    def __init__(self, game_path: str, later: Callable[[], bool] = lambda: False) -> None:
        self._load_rank = lambda: LOAD_AHEAD if later() else LOAD
        with _textworld_call(self._load_rank):
            textworld, generic_environment, filter_wrapper, demangler, infos_wrapper = textworld_parts()
            request = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
            env = generic_environment(request)
            for wrapper in (demangler(shuffle=False), infos_wrapper, filter_wrapper):
                env = wrapper(env)
            env.load(game_path)
        self._env = env

    def reset(self) -> str:
        """Start the game; return the initial observation (with the welcome banner)."""
        with _textworld_call(self._load_rank):
            observation, _infos = self._env.reset()
        return str(observation)

    def step(self, action: str) -> tuple[str, bool]:
        """Apply one command; return the observation and whether the game is won."""
        with _textworld_call(lambda: STEP):
            observation, _score, _done, infos = self._env.step(action)
        return str(observation), bool(infos["won"])

    def close(self) -> None:
        """Release the game."""
        with _textworld_call(lambda: LOAD):
            self._env.close()

    def __enter__(self) -> GameEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def textworld_parts() -> tuple[Any, Any, Any, Any, Any]:
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


def env_error_episode(error: BaseException, steps: int, transcript: list[str]) -> Episode:
    """The episode of a game that failed to start or to step: an environment error, never the agent's."""
    return Episode(
        success=False,
        steps=steps,
        trajectory="\n".join(transcript),
        status="ENV_ERROR",
        env_error=True,
        info={"error": f"{type(error).__name__}: {error}"},
    )
