"""Which task a proxied model call belongs to, and its text: one retrieval (and one receipt) per task.

A request names its task with the `X-Memrl-Task-Id` header or `metadata.memrl_task_id`; every call with
that id is one task. Without an id, the calls of one conversation are one task: the same messages up to
and including the task's user message (the first one, or with `task_message="latest"` the latest one),
each call carrying more messages than the last one answered (a tool loop, a chat continued with
`llm -c`; a retry of a failed call too) and not a copy of a call still being answered. A
Responses API call with `previous_response_id` continues the task of that response. The first call of a
task retrieves; every later call reuses the same memories and the same receipt.

The task's text is the `X-Memrl-Task` header, else `metadata.memrl_task`, else the text parts of the
task's user message (images and files are not text), cut to its last `task_chars` characters (the
question usually ends a long prompt), which is what is embedded and stored in the receipt.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from memrl_cli.bank.memory_bank import Retrieval
from memrl_cli.errors import MemrlError

TASK_MESSAGES = ("first", "latest")
MEMRL_METADATA = ("memrl_task", "memrl_task_id")  # metadata keys the proxy reads and never forwards
REMEMBERED = 1024  # tasks (and response ids) kept, least recently used dropped first


@dataclass
class Task:
    """One task's shared retrieval: made by its first call, its receipt stored once an upstream answered."""

    text: str
    calls: int = 0  # how many messages (or input items) its longest answered call carried
    in_flight: list[int] = field(default_factory=list)  # the message counts of its calls being answered
    retrieval: Retrieval | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def continued_by(self, calls: int) -> bool:
        """Whether a call with `calls` messages continues this conversation: more than its longest answered call
        (a retry of a failed call too), and not a copy of one being answered (the same task run twice at once)."""
        return calls > self.calls and calls not in self.in_flight


def text_of(content: Any) -> str:
    """The text of a message's content: a string, or its text parts (chat `text`, Responses `input_text`)."""
    if isinstance(content, list):
        content = "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
                            and p.get("type", "text") in ("text", "input_text"))
    return content if isinstance(content, str) else ""


def conversation(body: dict[str, Any]) -> list[Any] | None:
    """The request's messages: chat `messages`, or the Responses API's `input` (a string is one user message)."""
    if "messages" in body:
        messages = body["messages"]
        return messages if isinstance(messages, list) else None
    items = body.get("input")
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    return items if isinstance(items, list) else None


def user_index(messages: list[Any], which: str) -> int | None:
    """The index of the first or latest user message, None without one."""
    users = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"
             and m.get("type", "message") == "message"]
    return (users[0] if which == "first" else users[-1]) if users else None


def metadata_text(body: dict[str, Any], key: str) -> str | None:
    """`metadata[key]` when it is a non-blank string."""
    metadata = body.get("metadata")
    value = metadata.get(key) if isinstance(metadata, dict) else None
    return value if isinstance(value, str) and value.strip() else None


def without_memrl_metadata(body: dict[str, Any]) -> dict[str, Any]:
    """The body without memrl's metadata keys (and without `metadata` when nothing else was in it)."""
    metadata = body.get("metadata")
    if not isinstance(metadata, dict) or not any(k in metadata for k in MEMRL_METADATA):
        return body
    body = dict(body)
    kept = {k: v for k, v in metadata.items() if k not in MEMRL_METADATA}
    if kept:
        body["metadata"] = kept
    else:
        del body["metadata"]
    return body


def cap(text: str, chars: int) -> str:
    """The last `chars` characters of `text`, on a word boundary when one is near."""
    if len(text) <= chars:
        return text
    tail = text[-chars:]
    space = tail.find(" ", 0, 80)
    return tail[space + 1:] if space >= 0 else tail


class Tasks:
    """The tasks the proxy has seen recently, by id or by conversation, and which task each response id
    answered (for `previous_response_id`)."""

    def __init__(self, task_message: str = "first", task_chars: int = 2000, remembered: int = REMEMBERED) -> None:
        if task_message not in TASK_MESSAGES:
            raise MemrlError(f"task_message must be one of {', '.join(TASK_MESSAGES)}, got {task_message!r}")
        if task_chars < 1:
            raise MemrlError(f"task_chars must be at least 1, got {task_chars}")
        self.task_message = task_message
        self.task_chars = task_chars
        self.remembered = remembered
        self._tasks: OrderedDict[str, Task] = OrderedDict()
        self._responses: OrderedDict[str, Task] = OrderedDict()

    def _keep(self, table: OrderedDict[str, Task], key: str, task: Task) -> Task:
        table[key] = task
        table.move_to_end(key)
        while len(table) > self.remembered:
            table.popitem(last=False)
        return task

    def answered(self, response_id: str, task: Task) -> None:
        """Remember that `response_id` (a Responses API answer) belongs to `task`."""
        self._keep(self._responses, response_id, task)

    def find(self, body: dict[str, Any], headers: Any) -> tuple[Task | None, bool]:
        """The task this request belongs to (continued or new; None when it has no task text), and whether it
        continues a response of that task (`previous_response_id`: its memories are already upstream)."""
        messages = conversation(body) or []
        task_id = (headers.get("x-memrl-task-id") or metadata_text(body, "memrl_task_id") or "").strip()
        previous = body.get("previous_response_id")
        earlier = self._responses.get(previous) if isinstance(previous, str) else None
        named_task = self._tasks.get("id:" + task_id) if task_id else None
        if named_task is not None:  # a later call of a named task, whatever its text
            return self._keep(self._tasks, "id:" + task_id, named_task), earlier is named_task
        if earlier is not None and not task_id:
            return earlier, True
        at = user_index(messages, self.task_message)
        named = headers.get("x-memrl-task") or metadata_text(body, "memrl_task")
        text = named if named and named.strip() else text_of(messages[at].get("content")) if at is not None else ""
        if not text.strip():
            return None, False
        if task_id:
            key = "id:" + task_id
        else:
            leading = messages[:at + 1] if at is not None else []
            key = "conversation:" + hashlib.sha256(json.dumps([named, leading], sort_keys=True, ensure_ascii=False,
                                                              default=str).encode()).hexdigest()
        known = self._tasks.get(key)
        if known is not None and (task_id or known.continued_by(len(messages))):
            return self._keep(self._tasks, key, known), False
        return self._keep(self._tasks, key, Task(cap(text.strip(), self.task_chars))), False
