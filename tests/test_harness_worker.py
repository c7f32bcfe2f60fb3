"""memrl_bench.framework.worker and .pool alone, in this process, with a real Chat Completions server on
127.0.0.1: the memory text each method leaves, the episodes of a group played on threads in stream
order, environments loaded ahead, a failure that cancels the rest of its group, and in-process play's executor."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from benchmarks.testing.chat_server import ScriptedChatServer
from benchmarks.testing.toy_benchmark import code, responder

from memrl_bench.framework import worker
from memrl_bench.framework.baselines import ADJUST_SYSTEM
from memrl_bench.framework.llm import LLMSettings
from memrl_bench.framework.pool import open_pool
from memrl_bench.framework.protocol import LLM, Episode, Task
from memrl_bench.framework.experience import REFLECTION_SYSTEM

TOY = "benchmarks.testing.toy_benchmark:Passcodes"
ROOMS = [Task(f"train/room{r}", f"What is the passcode of room {r}?", payload=r) for r in (1, 2, 3)]


class Scripted:
    """An LLM-free adapter (a scripted testbed, `uses_llm = False`): every episode is won, or the environment fails."""

    name, train_split, eval_splits, uses_llm = "scripted", "train", (), False

    def __init__(self, data: str | None = None, limit: int | None = None, env_error: bool = False) -> None:
        self.env_error = env_error

    def tasks(self, split: str) -> list[Task]:
        return ROOMS

    def run_episode(self, task: Task, memories: list[dict[str, Any]], llm: LLM) -> Episode:
        return Episode(success=not self.env_error, steps=2, trajectory=f"> open {task.payload}\nopened",
                       env_error=self.env_error)

    def close(self) -> None:
        pass


class Breaking:
    """A thread-safe adapter whose `boom` task breaks after a moment, while the others keep asking the LLM."""

    name, train_split, eval_splits, thread_safe = "breaking", "train", (), True
    calls = 20  # LLM calls of an episode that is not cancelled

    def __init__(self, data: str | None = None, limit: int | None = None) -> None:
        pass

    def tasks(self, split: str) -> list[Task]:
        return []

    def run_episode(self, task: Task, memories: list[dict[str, Any]], llm: LLM) -> Episode:
        if task.payload == "boom":
            time.sleep(0.3)
            raise RuntimeError("the environment broke")
        for _ in range(self.calls):
            llm.chat([{"role": "user", "content": f"{task.query}: what is the passcode of room 1?"}])
        return Episode(success=True, steps=self.calls, trajectory="done")

    def close(self) -> None:
        pass


class Loading:
    """A fake environment (no game behind it) that loads ahead (`prepare`): it logs each load with its thread and
    each episode, and an episode is won only if its environment was loaded before it started."""

    name, train_split, eval_splits, thread_safe, uses_llm = "loading", "train", (), True, False
    log: list[tuple[str, ...]] = []
    asked: dict[str, Callable[[], bool]] = {}  # each task's `later`, to ask again afterwards
    seconds = 0.05  # to load an environment

    def __init__(self, data: str | None = None, limit: int | None = None) -> None:
        self.ready: set[str] = set()

    def tasks(self, split: str) -> list[Task]:
        return []

    def prepare(self, task: Task, later: Callable[[], bool] = lambda: False) -> None:
        time.sleep(Loading.seconds)
        Loading.log.append(("loaded", task.id, threading.current_thread().name, later()))
        Loading.asked[task.id] = later
        self.ready.add(task.id)

    def run_episode(self, task: Task, memories: list[dict[str, Any]], llm: LLM) -> Episode:
        Loading.log.append(("played", task.id))
        if task.payload == "boom":
            raise RuntimeError("the environment broke")
        return Episode(success=task.id in self.ready, steps=1, trajectory=task.id)

    def close(self) -> None:
        pass


def start(server: ScriptedChatServer, name: str = TOY, **options: Any) -> None:
    """Initialise this process as a worker (as `workers=0` does), on `server`."""
    worker.init_worker(name, None, None, options, LLMSettings(model="scripted", base_url=server.base_url,
                                                             api_key="test", concurrency=4))


@pytest.fixture(scope="module")
def server():
    with ScriptedChatServer(responder) as s:
        yield s


def note(room: int, passcode: str) -> dict[str, Any]:
    """A retrieved memory as the harness hands it to an episode."""
    return {"id": room, "intent": f"What is the passcode of room {room}?",
            "experience": f"the passcode of room {room} is {passcode}", "similarity": 1.0, "q": 0.0, "score": 0.0}


def test_an_episode_leaves_its_distilled_memory_and_its_own_usage(server) -> None:
    start(server, rooms=3)
    failed = worker.play(ROOMS[0], [], learn=True)
    assert not failed.episode.success and failed.used is None
    assert failed.experience is not None and f"room 1 is {code(1)}" in failed.experience  # the reflection
    assert failed.usage["calls"] == 2  # the answer and its distillation
    won = worker.play(ROOMS[1], [note(2, code(2))], learn=True)
    assert won.episode.success and won.usage["calls"] == 2
    evaluated = worker.play(ROOMS[1], [note(2, code(2))], learn=False)
    assert evaluated.experience is None and evaluated.usage["calls"] == 1  # evaluation distils nothing


def test_each_method_leaves_the_memory_text_of_its_rule(server) -> None:
    start(server, rooms=3)
    assert worker.play(ROOMS[0], [note(1, code(1))], learn=True, method="reflexion").experience is None  # a success
    assert worker.play(ROOMS[0], [], learn=True, method="reflexion").experience is not None
    before = len(server.requests)
    adjusted = worker.play(ROOMS[0], [note(1, "1111")], learn=True, method="memp")  # misled by its memory
    assert not adjusted.episode.success and adjusted.experience is not None
    assert adjusted.experience.startswith("SCRIPT:\n")
    systems = [r["messages"][0]["content"] for r in server.requests[before:]]
    assert systems[-1] == ADJUST_SYSTEM and REFLECTION_SYSTEM not in systems
    assert worker.play(ROOMS[0], [], learn=True, method="memp").experience is None  # nothing to adjust, no memory


def test_an_llm_free_adapter_keeps_its_trajectory_and_an_environment_failure_only_by_default(server) -> None:
    """The paper counts an episode the environment failed as a failure (it leaves a memory); the
    `skip_env_errors` switch leaves none."""
    start(server, f"{__name__}:Scripted")
    before = len(server.requests)
    played = worker.play(ROOMS[2], [], learn=True)
    assert played.experience == "TRAJECTORY:\n> open 3\nopened"
    start(server, f"{__name__}:Scripted", env_error=True)
    assert worker.play(ROOMS[2], [], learn=True).experience == "TRAJECTORY:\n> open 3\nopened"
    assert worker.play(ROOMS[2], [], learn=True, skip_env_errors=True).experience is None
    assert len(server.requests) == before


def test_a_group_plays_on_threads_and_returns_in_stream_order() -> None:
    with ScriptedChatServer(lambda request: {"content": responder(request), "delay": 0.1}) as slow:
        start(slow, rooms=3)
        memories = [[note(r, code(r))] for r in (1, 2, 3)]
        played = worker.play_group(ROOMS, memories, False, "memrl", threads=3)
        assert slow.max_in_flight > 1
    assert [p.episode.trajectory.split()[2] for p in played] == [code(1), code(2), code(3)]
    assert all(p.episode.success and p.usage["calls"] == 1 for p in played)


def test_a_group_loads_its_environments_then_the_next_groups_on_one_thread_in_order(server) -> None:
    start(server, f"{__name__}:Loading")
    Loading.log.clear()
    own, upcoming = ([Task(f"{kind}{i}", f"task {kind}{i}", i) for i in range(3)] for kind in ("own", "next"))
    played = worker.play_group(own, [[], [], []], False, "memrl", threads=3, upcoming=upcoming)
    assert [p.episode.trajectory for p in played] == ["own0", "own1", "own2"]
    assert all(p.episode.success for p in played)  # each started from its environment, loaded first
    deadline = time.monotonic() + 5
    while sum(entry[0] == "loaded" for entry in Loading.log) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)  # the next group's load on after the call returned, before that group is dealt
    assert all(p.episode.success for p in worker.play_group(upcoming, [[], [], []], False, "memrl", threads=3))
    loads = [entry for entry in Loading.log if entry[0] == "loaded"]  # each once: the next group found its own
    assert [(task_id, later) for _, task_id, _, later in loads] == [
        ("own0", False), ("own1", False), ("own2", False), ("next0", True), ("next1", True), ("next2", True)]
    assert {thread for _, _, thread, _ in loads} == {"loader_0"}
    assert not any(Loading.asked[f"next{i}"]() for i in range(3))  # asked now, their group is the one in play


def test_a_failed_episode_drops_the_loads_of_its_group_not_started(server) -> None:
    start(server, f"{__name__}:Loading")
    Loading.log.clear()
    tasks = [Task("boom", "task boom", "boom"), *(Task(f"own{i}", f"task own{i}", i) for i in range(4))]
    Loading.seconds = 0.2
    try:
        with pytest.raises(RuntimeError, match="the environment broke"):
            worker.play_group(tasks, [[]] * 5, False, "memrl", threads=5)
    finally:
        Loading.seconds = 0.05
    loaded = [entry[1] for entry in Loading.log if entry[0] == "loaded"]
    assert loaded == ["boom", "own0"]  # own0's load was under way; the others' never started
    assert [entry[1] for entry in Loading.log if entry[0] == "played"] == ["boom"]


def test_pinned_workers_take_each_group_in_the_same_process_batch_after_batch(server) -> None:
    settings = LLMSettings(model="scripted", base_url=server.base_url, api_key="test")
    with open_pool(2, (f"{__name__}:Loading", None, None, {}, settings), pinned=True) as pool:
        pids = [[pool.submit(g, os.getpid).result() for g in (0, 1)] for _batch in range(3)]
    assert pids[0] == pids[1] == pids[2] and pids[0][0] != pids[0][1]


def test_a_stopped_worker_drops_the_loads_it_has_not_started(server) -> None:
    """The run stopping (SIGTERM to its workers) leaves the queued loads undone: the worker exits by itself at once,
    instead of being killed after the 15 s grace while its loader works through 20 s of them."""
    settings = LLMSettings(model="scripted", base_url=server.base_url, api_key="test")
    upcoming = [Task(f"next{i}", f"task next{i}", i) for i in range(400)]  # 0.05 s each
    with pytest.raises(KeyboardInterrupt):
        with open_pool(1, (f"{__name__}:Loading", None, None, {}, settings), pinned=True) as pool:
            pool.submit(0, worker.load_ahead, [], upcoming).result()
            time.sleep(0.5)
            stopped = time.monotonic()
            raise KeyboardInterrupt
    assert time.monotonic() - stopped < 10


def test_the_first_failure_of_a_group_cancels_the_others_at_their_next_llm_call() -> None:
    tasks = [Task("a", "task a", "a"), Task("boom", "task boom", "boom"), Task("c", "task c", "c")]
    with ScriptedChatServer(lambda request: {"content": "ok", "delay": 0.05}) as slow:
        start(slow, f"{__name__}:Breaking")
        with pytest.raises(RuntimeError, match="the environment broke"):  # the failure itself, not a cancellation
            worker.play_group(tasks, [[], [], []], False, "memrl", threads=3)
        assert 0 < len(slow.requests) < 2 * Breaking.calls  # the two others stopped early
        finished = len(slow.requests)
        time.sleep(0.2)
        assert len(slow.requests) == finished  # nothing still asking
    assert not [t for t in threading.enumerate() if t.name.startswith("episode")]  # the group's threads are gone


def test_in_process_play_runs_at_once_and_hands_over_failures(server) -> None:
    settings = LLMSettings(model="scripted", base_url=server.base_url, api_key="test")
    with open_pool(0, (f"{__name__}:Breaking", None, None, {}, settings)) as pool:
        done = pool.submit(0, worker.play_group, [Task("a", "task a", "a")], [[]], False, "memrl", 1)
        assert done.done() and done.result()[0].episode.success
        failed = pool.submit(0, worker.play_group, [Task("boom", "task boom", "boom")], [[]], False, "memrl", 1)
        assert failed.done() and isinstance(failed.exception(), RuntimeError)  # as a worker process's would be
