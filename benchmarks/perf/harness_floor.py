"""The harness's own cost on ALFWorld: one epoch with an instant scripted LLM against the environment floor.

Floor: every game's gold walkthrough replayed in the same environment (`replay_walkthrough`), with
the same number of worker processes, no LLM, no memory. Harness: `run_benchmark` over the same
games (`train_split=valid_unseen`, one epoch, method memrl), the LLM being a real HTTP server on
127.0.0.1 that answers each turn with a walkthrough's next command (and distillation prompts with
a fixed sentence). Several games share a task text (trials of one task with objects elsewhere),
and the prompt cannot tell them apart, so the scripted agent tries their walkthroughs in turn,
moving to the next when the game answers a step with "Nothing happens.": it plays the floor's
steps, plus a few for a wrong first guess (both step counts are reported). So there are two floors:
the walkthrough replay, and the same scripted policy played straight against the game (no LLM,
no HTTP, no memory), whose steps are exactly the harness's. The ratio harness/floor is what
retrieval, prompts, HTTP, distillation, embedding and the bank add. CPU utilisation of the
whole machine is sampled from /proc/stat during each phase.

    python -m benchmarks.perf.harness_floor [--workers 2] [--limit N] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from memrl_bench.adapters.alfworld.benchmark import AlfworldBenchmark
from memrl_bench.adapters.alfworld.game import INVALID_ACTION, GameEnv
from memrl_bench.adapters.alfworld.prompt import TURN_PREFIX
from memrl_bench.adapters.alfworld.walkthrough import replay_walkthrough
from memrl_bench.adapters.alfworld.data import load_walkthrough, strip_banner
from memrl_bench.framework.config import BenchConfig
from memrl_bench.framework.harness import run_benchmark
from memrl_bench.framework.sampling import stratified_sample
from memrl_bench.framework.experience import REFLECTION_SYSTEM, SCRIPT_SYSTEM
from memrl_bench.framework.llm import LLMSettings

REPO = Path(__file__).resolve().parents[2]
ARCHIVE = REPO.parent / "shared" / "data" / "alfworld" / "json_2.1.1_full_with_traj.tar.xz"
SPLIT = "valid_unseen"


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    fields = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def timed_with_cpu(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """Run `fn`; return (its result, wall seconds, machine CPU utilisation in [0, 1] over the run)."""
    busy0, total0 = cpu_times()
    start = time.perf_counter()
    result = fn()
    wall = time.perf_counter() - start
    busy1, total1 = cpu_times()
    return result, wall, (busy1 - busy0) / max(total1 - total0, 1.0)


def next_action(plans: list[list[str]], observations: list[str]) -> str:
    """The scripted agent's action after `observations` (the task text, then one per turn played).

    Deterministic, so the whole episode is re-derived from the conversation on every request:
    follow the first walkthrough; when the game answers one of its steps with "Nothing happens."
    (e.g. the object to take is elsewhere in this trial), or it ends without a win, switch to the
    next walkthrough: from where it stands if it shares the steps played, else from its beginning
    (navigation in ALFWorld is absolute; going where the agent already is does nothing).
    """
    plan, step = 0, 0
    for observation in observations[1:]:  # the outcome of the step played before it
        played = plans[plan][step] if step < len(plans[plan]) else "look"
        if observation.strip() == INVALID_ACTION and not played.startswith("go to ") and plan + 1 < len(plans):
            plan, step = plan + 1, 0
            continue
        step += 1
        while step >= len(plans[plan]) and plan + 1 < len(plans):  # ended without a win
            plan += 1
            step = step if plans[plan][:step] == plans[plan - 1][:step] else 0
    return plans[plan][step] if step < len(plans[plan]) else "look"


def walkthroughs(tasks: list[Any]) -> dict[str, list[list[str]]]:
    """Every task text's walkthroughs, in task order (one per game sharing the text)."""
    plans: dict[str, list[list[str]]] = {}
    for task in tasks:
        plans.setdefault(task.query, []).append(load_walkthrough(task.payload))
    return plans


def scripted_agent(tasks: list[Any]) -> Callable[[dict[str, Any]], str]:
    """Walkthrough commands for agent turns; a fixed lesson for the distillation prompts."""
    plans = walkthroughs(tasks)

    def respond(request: dict[str, Any]) -> str:
        messages = request["messages"]
        if messages[0]["content"] in (SCRIPT_SYSTEM, REFLECTION_SYSTEM):
            return "Find the object first, take it, then finish the task at the target receptacle."
        start = max(i for i, m in enumerate(messages) if m["role"] == "user" and m["content"].startswith(TURN_PREFIX))
        task_text = messages[start]["content"][len(TURN_PREFIX):]
        observations = [task_text] + [m["content"].removeprefix("Observation: ") for m in messages[start + 1:]
                                      if m["role"] == "user"]
        return f"Thought: I follow the plan.\nAction: {next_action(plans[task_text], observations)}"

    return respond


def play_policy(task: Any, plans: list[list[str]], max_steps: int = 30) -> tuple[bool, int]:
    """The scripted policy straight against the game: (won, steps)."""
    with GameEnv(task.payload) as env:
        observations = [strip_banner(env.reset())]
        won = False
        while not won and len(observations) <= max_steps:
            observation, won = env.step(next_action(plans, observations))
            observations.append(observation)
    return won, len(observations) - 1


def replay_all(tasks: list[Any], workers: int, policy: bool = False) -> list[tuple[bool, int]]:
    """A floor: every walkthrough (or the scripted policy) played by `workers` spawned processes."""
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        if policy:
            plans = walkthroughs(tasks)
            return list(pool.map(play_policy, tasks, [plans[t.query] for t in tasks]))
        return [(e.success, e.steps) for e in pool.map(replay_walkthrough, tasks)]


def measure(workers: int = 2, limit: int | None = None, data: str | None = None) -> dict[str, Any]:
    """Floor and harness wall time over the split's games, with CPU utilisation."""
    from benchmarks.testing.chat_server import ScriptedChatServer

    data = data or os.environ.get("ALFWORLD_DATA") or str(ARCHIVE)
    adapter = AlfworldBenchmark(data=data, train_split=SPLIT)  # unpacks the data once, untimed
    tasks = stratified_sample(adapter.tasks(SPLIT), limit, 0, "train")  # the games `limit` makes the harness play
    adapter.examples()  # built from training games once and cached, untimed
    floor, floor_s, floor_cpu = timed_with_cpu(lambda: replay_all(tasks, workers))
    policy, policy_s, policy_cpu = timed_with_cpu(lambda: replay_all(tasks, workers, policy=True))
    with tempfile.TemporaryDirectory() as scratch, ScriptedChatServer(scripted_agent(tasks)) as server:
        config = BenchConfig(benchmark="alfworld", method="memrl", epochs=1, batch_size=32, limit=limit, data=data,
                             options={"train_split": SPLIT})
        settings = LLMSettings(model="scripted", base_url=server.base_url, api_key="test", max_retries=0, timeout=60)
        summary, harness_s, harness_cpu = timed_with_cpu(lambda: run_benchmark(
            config, settings, runs_dir=scratch, workers=workers))
        requests = len(server.requests)
        episodes = [json.loads(line) for line in (Path(summary["bank"]).parent / "episodes.jsonl").open()]
    return {"games": len(tasks), "workers": workers, "floor_s": floor_s, "floor_cpu": floor_cpu,
            "floor_successes": sum(won for won, _ in floor), "floor_steps": sum(steps for _, steps in floor),
            "policy_floor_s": policy_s, "policy_floor_cpu": policy_cpu,
            "policy_floor_successes": sum(won for won, _ in policy), "policy_floor_steps": sum(s for _, s in policy),
            "harness_s": harness_s, "harness_cpu": harness_cpu,
            "harness_successes": sum(e["success"] for e in episodes), "harness_steps": sum(e["steps"] for e in episodes),
            "llm_requests": requests, "ratio": harness_s / floor_s, "policy_ratio": harness_s / policy_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="Worker processes for both phases [2].")
    parser.add_argument("--limit", type=int, default=None, help="Only N games, the stratified sample `--limit N` plays [all 134].")
    parser.add_argument("--data", default=None, help="ALFWorld data [$ALFWORLD_DATA, else the shared archive].")
    parser.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    args = parser.parse_args()
    result = measure(args.workers, args.limit, args.data)
    print(json.dumps(result, indent=2) if args.json else
          f"{result['games']} games, {args.workers} workers: floor {result['floor_s']:.1f} s "
          f"(CPU {result['floor_cpu']:.0%}), same-policy floor {result['policy_floor_s']:.1f} s, harness "
          f"{result['harness_s']:.1f} s (CPU {result['harness_cpu']:.0%}), ratios {result['ratio']:.2f} and "
          f"{result['policy_ratio']:.2f}")


if __name__ == "__main__":
    main()
