"""The worker side: what each worker process holds, and how it plays episodes.

A worker process (or this process, with `workers=0`) is initialised once with its own adapter
and `ChatClient` (`init_worker`); the harness then hands it groups of episodes (`play_group`),
each with the memories retrieved for it before the batch began. An episode plays the task,
then (when training) turns itself into memory text: the method's distillation, or the
trajectory itself for an LLM-free adapter. Episodes of a group run on threads, each with its
own view of the client (its own token usage); the first failure, or SIGTERM to the worker,
ends the others at their next LLM call.

An adapter with `prepare(task, later)` (ALFWorld: load and reset the game) has its environments
loaded by one thread of the worker, in order: first the group's own (before any step of its
episodes), then those of the group the same process will play in the next batch (`upcoming`, the
next stream's first after a stream's last; after the steps of the episodes in play), so that the
next batch's loading runs while this batch's last episodes wait for the LLM. Loading needs neither
memories nor the bank.
"""

from __future__ import annotations

import atexit
import gc
import signal
import threading
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass
from typing import Any

from memrl_bench.framework import baselines, registry, self_rag
from memrl_bench.framework.llm import ChatClient, LLMSettings
from memrl_bench.framework.protocol import LLM, Benchmark, Episode, Task
from memrl_bench.framework.experience import distil


@dataclass
class Played:
    """What a worker sends back: the episode, its memory text (training only), token usage, and the
    memories the answer used when a method narrows the retrieved ones (self-rag; None: all of them)."""

    episode: Episode
    experience: str | None
    usage: dict[str, int]
    used: list[int] | None = None


_ADAPTER: Benchmark | None = None
_LLM: ChatClient | None = None
_STOPPING = False  # set in a worker by SIGTERM: later episodes end at once
_LOADER: ThreadPoolExecutor | None = None  # loads environments ahead of their episodes, one at a time, in order
_LOADING: dict[str, Future] = {}  # task id -> its environment's loading, until its episode starts
_PLAYING: frozenset[str] = frozenset()  # the task ids of the group this worker plays now (or is about to)


def init_worker(name: str, data: str | None, limit: int | None, options: dict[str, Any],
                settings: LLMSettings) -> None:
    """This process's adapter (closed at exit) and LLM client, for the episodes it will play."""
    global _ADAPTER, _LLM, _LOADER
    _ADAPTER = registry.create(name, data, limit, options)
    _LLM = ChatClient(settings)
    atexit.register(_ADAPTER.close)
    _LOADING.clear()  # a new adapter: nothing loaded for it yet
    if _LOADER is None and can_prepare(_ADAPTER):
        _LOADER = ThreadPoolExecutor(1, thread_name_prefix="loader")


def can_prepare(adapter: Any) -> bool:
    """True for a thread-safe adapter with `prepare(task, later)`: its environments load on another thread."""
    return bool(getattr(adapter, "thread_safe", False)) and callable(getattr(adapter, "prepare", None))


def load_ahead(playing: list[Task], upcoming: Sequence[Task] = ()) -> None:
    """Queue the loading of the environments of `playing` (the group this worker plays now; none for a process
    with no game in the batch), then of `upcoming` (its group of the next batch), after those queued before;
    nothing if the adapter cannot prepare them."""
    global _PLAYING
    if _LOADER is None or not can_prepare(_ADAPTER):
        return
    _PLAYING = frozenset(task.id for task in playing)
    for task in [*playing, *upcoming]:
        if task.id not in _LOADING:
            _LOADING[task.id] = _LOADER.submit(_load, task)


def _load(task: Task) -> None:
    """Prepare `task`'s environment (nothing once the worker is stopping); while its group is not the one in play,
    it yields to the steps of that group's episodes."""
    if not _STOPPING:
        _ADAPTER.prepare(task, later=lambda: task.id not in _PLAYING)  # type: ignore[union-attr]


def stop_loading() -> None:
    """Drop the loads not yet started (the one in progress ends by itself): the run is stopping."""
    for loading in list(_LOADING.values()):
        loading.cancel()


def init_pool_worker(*initargs: Any) -> None:
    """A worker process: SIGTERM ends the episode in flight through its cleanups, and every later one. At exit the
    interpreter skips its last garbage collection (`_skip_final_collection`)."""
    signal.signal(signal.SIGTERM, _stop_worker)
    atexit.register(_skip_final_collection)  # registered before the adapter's close, so it runs after it
    init_worker(*initargs)


def _skip_final_collection() -> None:
    """Exempt every object alive from the collection the interpreter makes as it exits: over the objects of the ~30
    games a process played, it took 2.3 s at the end of each run (0.4 s without it; docs/performance-harness.md). No exit
    handler of a worker relies on the collector."""
    gc.disable()
    gc.freeze()


def _stop_worker(signum: int, frame: Any) -> None:
    global _STOPPING
    _STOPPING = True  # (the loads still queued return at once)
    raise SystemExit(128 + signum)


class _Cancelled(BaseException):
    """Ends an episode at its next LLM call: another episode of its group failed, or the worker is stopping."""


class _EpisodeLLM:
    """One episode's view of the worker's `ChatClient`: usage of its own, and cancellable between calls."""

    def __init__(self, client: ChatClient, cancel: threading.Event) -> None:
        self._client = client.scoped()
        self._cancel = cancel

    def chat(self, messages: list[dict[str, Any]], **params: Any) -> str:
        if self._cancel.is_set():
            raise _Cancelled
        return self._client.chat(messages, **params)

    def __getattr__(self, name: str) -> Any:  # settings, take_usage, ...: the client's own
        return getattr(self._client, name)


def play(task: Task, memories: list[dict[str, Any]], learn: bool, method: str = "memrl",
         cancel: threading.Event | None = None, skip_env_errors: bool = False, seed: int | None = None) -> Played:
    """One episode of `task` with `memories`, and (when `learn`) the memory text it leaves (none for an
    episode the environment failed, with `skip_env_errors`)."""
    loading = _LOADING.get(task.id)
    if loading is not None:  # its environment is loaded, or being loaded, ahead: the episode starts from it
        wait_for([loading])  # (an adapter's prepare failing, against the protocol, leaves the start to run_episode)
        _LOADING.pop(task.id, None)
    if _STOPPING:
        raise SystemExit(128 + signal.SIGTERM)
    if cancel is not None and cancel.is_set():
        raise _Cancelled
    assert _ADAPTER is not None and _LLM is not None
    llm = _EpisodeLLM(_LLM, cancel or threading.Event())
    used = None
    if method == "self-rag":
        episode, used = self_rag.play(_ADAPTER, task, memories, llm)  # type: ignore[arg-type]
    elif takes_seed(_ADAPTER):  # the seed: an optional part of the protocol (`takes_seed`)
        episode = _ADAPTER.run_episode(task, memories, llm, seed=seed)  # type: ignore[call-arg]
    else:
        episode = _ADAPTER.run_episode(task, memories, llm)
    experience = None
    if learn and not (skip_env_errors and episode.env_error):
        experience = _experience(llm, method, task, memories, episode) if uses_llm(_ADAPTER) \
            else f"TRAJECTORY:\n{episode.trajectory}"  # an LLM-free adapter's trajectory is its memory
    return Played(episode, experience, llm.take_usage(), used)


def play_group(tasks: list[Task], memories: list[list[dict[str, Any]]], learn: bool, method: str,
               threads: int, upcoming: list[Task] | None = None, skip_env_errors: bool = False,
               seeds: list[int] | None = None) -> list[Played]:
    seeds = seeds or [None] * len(tasks)  # type: ignore[list-item]
    """Play episodes in this worker, `threads` at a time (in order); the first failure cancels the others.
    `upcoming`: the tasks this worker will play next, whose environments it loads once the group's own are."""
    load_ahead(tasks, upcoming or [])
    if threads <= 1:
        try:
            return [play(t, m, learn, method, None, skip_env_errors, s) for t, m, s in zip(tasks, memories, seeds)]
        except BaseException:
            stop_loading()  # the run is stopping: nothing more to load
            raise
    cancel = threading.Event()
    pool = ThreadPoolExecutor(threads, thread_name_prefix="episode")
    try:
        futures = [pool.submit(play, t, m, learn, method, cancel, skip_env_errors, s)
                   for t, m, s in zip(tasks, memories, seeds)]
        wait_for(futures, return_when=FIRST_EXCEPTION)
        if any(f.done() and f.exception() is not None for f in futures):
            cancel.set()
            stop_loading()  # (episodes waiting for their environment's load end at once)
            for f in futures:
                f.cancel()
            wait_for(futures)
            errors = [e for f in futures if not f.cancelled() and (e := f.exception()) is not None]
            raise next((e for e in errors if not isinstance(e, _Cancelled)), errors[0])
        return [f.result() for f in futures]
    except BaseException:  # Ctrl-C, SIGTERM (the worker is stopping) or a failed episode: end the others
        cancel.set()
        stop_loading()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _experience(llm: LLM, method: str, task: Task, memories: list[dict[str, Any]],
                episode: Episode) -> str | None:
    """The memory text an episode leaves under `method` (None: it leaves none)."""
    if method == "memp" and not episode.success:  # adjustment of the top memory used, else nothing (validation)
        return baselines.adjust(llm, memories[0], task.query, episode.trajectory) if memories else None
    if method == "reflexion" and episode.success:  # Reflexion reflects on failed trials only
        return None
    return distil(llm, task.query, episode.trajectory, episode.success)


def takes_seed(adapter: Any) -> bool:
    """True for an adapter declaring `takes_seed = True`: its `run_episode` gets the episode's `seed`, a
    function of the run's seed and the episode's place in the stream only (the same for every method)."""
    return bool(getattr(adapter, "takes_seed", False))


def uses_llm(adapter: Any) -> bool:
    """False for an adapter declaring `uses_llm = False` (scripted testbeds): no LLM check, no distillation."""
    return bool(getattr(adapter, "uses_llm", True))
