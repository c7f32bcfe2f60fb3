"""The proxy's work with the bank for one model call, which never holds the agent up for long: the task
the call belongs to (in the proxy's memory, else in the bank), its retrieval, its receipt, and the task
state the bank keeps (`memrl_cli.serving.proxy_tasks`).

Every bank step of a call runs on a worker thread and waits at most the server's bank wait for a lock
another process holds (`--bank-wait`, 2 s by default: `BankService(busy_timeout=...)`). The first step
that fails (the bank is busy, or cannot be used at all: damaged, its server down) ends the call's use of
the bank: the call goes on to the upstream without memories (or, when its memories were already chosen,
without a receipt, which the task's next call stores), and its answer says why in the header
`X-Memrl-Warning`, without saying where the bank is. So a call waits for the bank once, at most. A bank
that does not answer at all (a PostgreSQL server that hangs, a network that drops its packets) is given
up the same way when a step has taken the bank wait plus `STEP_GRACE` seconds (the grace covers honest
slow steps: loading the embedding model, a large first retrieval); the step's thread finishes on its own.

Writes that only keep the task state current (a longer conversation, a response id) are made in the
background, one batch at a time, and never delay an answer.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool

from memrl_cli.bank.memory_bank import Retrieval
from memrl_cli.errors import BankBusyError, MemrlError
from memrl_cli.method.retrieval import RetrieveParams
from memrl_cli.serving.proxy_tasks import Call, Task, Tasks
from memrl_cli.serving.service import BankService

WARNING_HEADER = "X-Memrl-Warning"
STEP_GRACE = 10.0  # seconds a bank step may take beyond the bank wait before the call goes on without it
T = TypeVar("T")


class CallState:
    """One call's use of the bank: each step at most one wait, and none after the first failure."""

    def __init__(self, service: BankService, what: str) -> None:
        self.service = service
        self.what = what  # the request, for the operator's log
        self.problem: str | None = None  # why the bank was given up, as the client is told

    async def step(self, fn: Callable[..., T], *args: Any) -> T | None:
        """`fn(*args)` on a worker thread; None when the bank was given up (now or by an earlier step)."""
        if self.problem is not None:
            return None
        try:
            return await asyncio.wait_for(run_in_threadpool(fn, *args),
                                          (self.service.pool.busy_timeout or 0) + STEP_GRACE)
        except asyncio.TimeoutError:
            self.problem = "the bank did not answer"
            sys.stderr.write(f"memrl: warning: {self.what} went on without the bank: it did not answer in time\n")
            sys.stderr.flush()
            return None
        except MemrlError as exc:
            self.problem = ("the bank is busy: another process holds it" if isinstance(exc, BankBusyError)
                            else "the bank cannot be used now")
            sys.stderr.write(f"memrl: warning: {self.what} went on without the bank: {exc}\n")
            sys.stderr.flush()
            return None

    def warning(self, retrieval: Retrieval | None) -> str | None:
        """What the answer's `X-Memrl-Warning` says: what the call went without, and why (None: nothing)."""
        if self.problem is None:
            return None
        if retrieval is None:
            return f"no memories: {self.problem}"
        if retrieval.id is None:
            return f"no receipt: {self.problem}; the task's next call stores it"
        return None


class TaskState:
    """The tasks of one proxy: found in its memory or in the bank, their retrievals and receipts, and the
    background writes that keep the bank's copy current."""

    def __init__(self, service: BankService, tasks: Tasks) -> None:
        self.service = service
        self.tasks = tasks
        self._pending: dict[str, tuple[int, int]] = {}  # key -> (retrieval id, calls) not written yet
        self._writer: asyncio.Task[None] | None = None

    async def task(self, call: Call, state: CallState) -> tuple[Task | None, bool]:
        """The task of this call (None: it has no task text and continues none), and whether it continues one of
        the task's responses (its memories are upstream already). A task that ended (its receipt rewarded)
        gives way to a new one; a task the proxy does not remember is looked for in the bank."""
        task, continued = self.tasks.find(call)
        if task is not None and task.retrieval is not None and task.retrieval.id is not None:
            if await state.step(self.service.task_ended, task.retrieval.id):
                self.tasks.ended(task)
                task, continued = None, False
        if task is None:
            for key, rid, calls in sorted(await state.step(self.service.open_tasks, call.keys(), self.tasks.expiry)
                                          or [], key=lambda row: call.keys().index(row[0])):
                retrieval = await state.step(self.service.recorded, rid)
                if retrieval is not None:
                    task, continued = self.tasks.adopt(call, key, calls, retrieval)
                break
        if task is None:
            task, continued = self.tasks.new(call), False
        return task, continued

    async def retrieval(self, task: Task, params: RetrieveParams, state: CallState) -> Retrieval | None:
        """The task's retrieval, made by its first call (None: the bank was given up before it was made)."""
        async with task.lock:
            if task.retrieval is None:
                task.retrieval = await state.step(self.service.select, task.text, params, task.task_id, task.scope)
        return task.retrieval

    async def receipt(self, task: Task, retrieval: Retrieval, calls: int, state: CallState) -> int | None:
        """The task's receipt, stored by its first answered call with the task's key (`calls` messages); None
        while the bank cannot take it."""
        async with task.lock:
            if retrieval.id is None and await state.step(self.service.record, retrieval, (task.key, calls),
                                                         self.tasks.expiry) is not None:
                task.calls = max(task.calls, calls)  # the bank has it with the receipt
        return retrieval.id

    def called(self, task: Task, calls: int) -> None:
        """A call of `task` with `calls` messages was answered: the bank's copy learns it (in the background)."""
        if calls > task.calls and task.retrieval is not None and task.retrieval.id is not None:
            self._write(task.key, task.retrieval.id, calls)
        task.calls = max(task.calls, calls)

    def answered(self, response_id: str, task: Task) -> None:
        """`response_id` (a Responses API answer) belongs to `task`, in memory and (in the background) in the bank."""
        self.tasks.answered(response_id, task)
        if task.retrieval is not None and task.retrieval.id is not None:
            self._write("response:" + response_id, task.retrieval.id, 0)

    def _write(self, key: str, retrieval_id: int, calls: int) -> None:
        earlier = self._pending.get(key)
        self._pending[key] = (retrieval_id, max(calls, earlier[1] if earlier and earlier[0] == retrieval_id else 0))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self.flush())

    async def flush(self) -> None:
        """Write the pending task changes, batch after batch, until none is left (errors: one line on stderr)."""
        while self._pending:
            rows = [(key, rid, calls) for key, (rid, calls) in self._pending.items()]
            self._pending = {}
            try:
                await run_in_threadpool(self.service.touch_tasks, rows)
            except MemrlError as exc:
                sys.stderr.write(f"memrl: warning: the task state of {len(rows)} call(s) was not kept: {exc}\n")
                sys.stderr.flush()

    async def close(self) -> None:
        """Write what is pending before the proxy stops."""
        if self._writer is not None:
            await self._writer
        await self.flush()
