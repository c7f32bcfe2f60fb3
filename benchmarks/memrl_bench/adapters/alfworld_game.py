"""One ALFWorld game in TextWorld, wrapped as ALFWorld's official `AlfredTWEnv` wraps its games.

`GameEnv` builds a single-game environment (PDDL backend, `AlfredDemangler(shuffle=False)`,
`AlfredInfos`), so observations and the set of valid commands are the official ones, and whether
the game is won comes from the game itself, never from the agent's words. TextWorld and ALFWorld
are imported on the first game (slow, once per process).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from memrl_bench.framework.protocol import Episode
from memrl_cli.errors import MemrlError

INVALID_ACTION = "Nothing happens."  # what the game answers to a command it cannot carry out

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
            textworld, generic_environment, filter_wrapper, demangler, infos_wrapper = textworld_parts()
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
