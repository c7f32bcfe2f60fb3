"""The worker processes that play a run's episodes: starting them, dealing a batch's episodes to
them, and stopping them.

`open_pool(workers, initargs, pinned)` starts `workers` spawned processes, each initialised by
`memrl_bench.framework.worker.init_pool_worker` (0: play in this process, for debugging and tiny
runs). `episode_groups` says how a batch is dealt: groups of positions, each played on threads
by one call of a worker. Pinned workers take group g of every batch in the same process g, which
then holds the games it loaded ahead for it (`worker.play_group`'s `upcoming`); unpinned ones take
calls as they free up. When the run stops (Ctrl-C, SIGTERM through
`memrl_bench.framework.signals`, or an error), the episodes in flight are stopped with it.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

from memrl_bench.framework.worker import init_pool_worker, init_worker, stop_loading


def episode_groups(n: int, processes: int, concurrency: int, threaded: bool) -> list[tuple[list[int], int]]:
    """How a batch of `n` episodes is played: (positions, threads) for each call of a worker process.

    Thread-safe adapters: one group per process used (group g to process g when pinned), positions
    dealt round robin (stream order clusters task types), threads summing to at most `concurrency`.
    Otherwise one episode per call, so the processes take them as they free up (at most `processes`
    in flight).
    """
    if not threaded:
        return [([i], 1) for i in range(n)]
    groups = max(1, min(processes, concurrency, n))
    return [(list(range(g, n, groups)), min(concurrency // groups + (g < concurrency % groups), len(range(g, n, groups))))
            for g in range(groups)]


class Workers:
    """A run's worker processes. `submit(group, fn, ...)` runs `fn` in one of them: with `pinned`, call `group`
    always in process `group % workers` (what it prepared for the group's next batch is there); else in
    whichever process frees up first."""

    def __init__(self, executors: Sequence[Executor], pinned: bool) -> None:
        self.executors, self.pinned = executors, pinned

    @property
    def spawned(self) -> bool:
        """True when the episodes play in processes of their own (which start with the first batch)."""
        return not isinstance(self.executors[0], _InProcess)

    def submit(self, group: int, fn: Callable, /, *args: Any) -> Future:
        return self.executors[group % len(self.executors) if self.pinned else 0].submit(fn, *args)


@contextmanager
def open_pool(workers: int, initargs: tuple, pinned: bool = False) -> Iterator[Workers]:
    """`workers` worker processes initialised with `initargs` (0: this process), stopped with the block.
    `pinned`: one executor per process, so that a group's calls all land in the same process."""
    if workers <= 0:
        try:
            yield Workers([_InProcess(initargs)], pinned)
        except BaseException:  # stopped between batches: nothing more to load (the processes below: SIGTERM)
            stop_loading()
            raise
        return
    spawn = multiprocessing.get_context("spawn")
    pools = [ProcessPoolExecutor(max_workers=1 if pinned else workers, mp_context=spawn,
                                 initializer=init_pool_worker, initargs=initargs)
             for _ in range(workers if pinned else 1)]
    try:
        yield Workers(pools, pinned)
    except BaseException:  # Ctrl-C, SIGTERM (memrl_bench.framework.signals) or an error: stop the episodes in flight
        _stop_workers(pools)
        raise
    finally:
        for pool in pools:
            pool.shutdown(wait=True, cancel_futures=True)


def _stop_workers(pools: list[ProcessPoolExecutor], grace: float = 15.0) -> None:
    """SIGTERM each worker (it unwinds its episode), then SIGKILL any still alive after `grace` seconds."""
    # ProcessPoolExecutor has no public way to stop busy workers before Python 3.14 (terminate_workers).
    processes = [p for pool in pools for p in (getattr(pool, "_processes", None) or {}).values()]
    managers = [m for pool in pools if (m := getattr(pool, "_executor_manager_thread", None)) is not None]
    for pool in pools:
        pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(grace)
        if process.is_alive():
            process.kill()
            process.join()
    for manager in managers:  # else its wake-up pipe may close while Python's exit handler writes to it (EBADF)
        manager.join(grace)


class _InProcess(Executor):
    """`workers=0`: play episodes in this process (debugging, tiny runs); `submit` runs at once."""

    def __init__(self, initargs: tuple) -> None:
        init_worker(*initargs)

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:  # type: ignore[override]
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - handed over as a worker's would be
            future.set_exception(exc)
        return future
