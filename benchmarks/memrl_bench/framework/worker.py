"""The worker side: what each worker process holds, and how it plays episodes.

A worker process (or this process, with `workers=0`) is initialised once with its own adapter
and `ChatClient` (`init_worker`); the harness then hands it groups of episodes (`play_group`),
each with the memories retrieved for it before the batch began. An episode plays the task,
then (when training) turns itself into memory text: the method's distillation, or the
trajectory itself for an LLM-free adapter. Episodes of a group run on threads, each with its
own view of the client (its own token usage); the first failure, or SIGTERM to the worker,
ends the others at their next LLM call.
"""

from __future__ import annotations

import atexit
import signal
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass
from typing import Any

from memrl_bench.framework import baselines, registry, self_rag
from memrl_bench.framework.llm import ChatClient, LLMSettings
from memrl_bench.framework.protocol import LLM, Benchmark, Episode, Task
from memrl_cli.experience import distil


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


def init_worker(name: str, data: str | None, limit: int | None, options: dict[str, Any],
                settings: LLMSettings) -> None:
    """This process's adapter (closed at exit) and LLM client, for the episodes it will play."""
    global _ADAPTER, _LLM
    _ADAPTER = registry.create(name, data, limit, options)
    _LLM = ChatClient(settings)
    atexit.register(_ADAPTER.close)


def init_pool_worker(*initargs: Any) -> None:
    """A worker process: SIGTERM ends the episode in flight through its cleanups, and every later one."""
    signal.signal(signal.SIGTERM, _stop_worker)
    init_worker(*initargs)


def _stop_worker(signum: int, frame: Any) -> None:
    global _STOPPING
    _STOPPING = True
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
         cancel: threading.Event | None = None) -> Played:
    """One episode of `task` with `memories`, and (when `learn`) the memory text it leaves."""
    if _STOPPING:
        raise SystemExit(128 + signal.SIGTERM)
    if cancel is not None and cancel.is_set():
        raise _Cancelled
    assert _ADAPTER is not None and _LLM is not None
    llm = _EpisodeLLM(_LLM, cancel or threading.Event())
    used = None
    if method == "self-rag":
        episode, used = self_rag.play(_ADAPTER, task, memories, llm)  # type: ignore[arg-type]
    else:
        episode = _ADAPTER.run_episode(task, memories, llm)
    experience = None
    if learn and not episode.env_error:
        experience = _experience(llm, method, task, memories, episode) if uses_llm(_ADAPTER) \
            else f"TRAJECTORY:\n{episode.trajectory}"  # an LLM-free adapter's trajectory is its memory
    return Played(episode, experience, llm.take_usage(), used)


def play_group(tasks: list[Task], memories: list[list[dict[str, Any]]], learn: bool, method: str,
               threads: int) -> list[Played]:
    """Play episodes in this worker, `threads` at a time (in order); the first failure cancels the others."""
    if threads <= 1:
        return [play(t, m, learn, method) for t, m in zip(tasks, memories)]
    cancel = threading.Event()
    pool = ThreadPoolExecutor(threads, thread_name_prefix="episode")
    try:
        futures = [pool.submit(play, t, m, learn, method, cancel) for t, m in zip(tasks, memories)]
        wait_for(futures, return_when=FIRST_EXCEPTION)
        if any(f.done() and f.exception() is not None for f in futures):
            cancel.set()
            for f in futures:
                f.cancel()
            wait_for(futures)
            errors = [e for f in futures if not f.cancelled() and (e := f.exception()) is not None]
            raise next((e for e in errors if not isinstance(e, _Cancelled)), errors[0])
        return [f.result() for f in futures]
    except BaseException:  # Ctrl-C, SIGTERM (the worker is stopping) or a failed episode: end the others
        cancel.set()
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


def uses_llm(adapter: Any) -> bool:
    """False for an adapter declaring `uses_llm = False` (scripted testbeds): no LLM check, no distillation."""
    return bool(getattr(adapter, "uses_llm", True))
