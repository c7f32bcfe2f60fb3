"""ALFWorld games played by their gold walkthroughs: the harness-free floor and a scripted agent.

`replay_walkthrough` plays a task's walkthrough straight in the episode environment (what an
episode costs without any model); `walkthrough_responder` is a chat responder that plays each
task's walkthrough through the real adapter (for scripted-LLM tests and benchmarks).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from memrl_bench.adapters.alfworld.data import load_walkthrough, strip_banner
from memrl_bench.adapters.alfworld.game import GameEnv, env_error_episode
from memrl_bench.adapters.alfworld.prompt import TURN_PREFIX
from memrl_bench.framework.protocol import Episode, Task
from memrl_cli.errors import MemrlError


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
        return env_error_episode(error, steps, transcript)
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
