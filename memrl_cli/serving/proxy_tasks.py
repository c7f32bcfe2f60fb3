"""Which task a proxied model call belongs to, and its text: one retrieval (and one receipt) per task.

A request names its task with the `X-Memrl-Task-Id` header, `metadata.memrl_task_id`, or (the Responses
API) its `conversation`; every call with that id (in one scope) is one task, and the receipt keeps the id,
so that `memrl reward --task ID` and `POST /v1/memrl/rewards {"task": ID}` find it. Without an id, the
calls of one conversation are one task: the same messages up to and including the task's user message
(the first one, or with `task_message="latest"` the latest one), each call carrying more messages than
the last one answered (a tool loop, a chat continued with `llm -c`; a retry of a failed call too) and not
a copy of a call still being answered. A Responses API call with `previous_response_id` continues the
task of that response. The first call of a task retrieves; every later call reuses the same memories and
the same receipt. A task ends with its reward: a later call under the same id (or of the same
conversation) opens a new task, with a new retrieval and a new receipt.

The task's text is the `X-Memrl-Task` header, else `metadata.memrl_task`, else the text parts of the
task's user message (images and files are not text), cut to its last `task_chars` characters (the
question usually ends a long prompt), which is what is embedded and stored in the receipt.

`Tasks` is the proxy's memory of tasks; the bank keeps them too (its `tasks` table: key, receipt, calls),
so that a restarted proxy continues a task rather than starting it again, for `expiry` seconds after its
last call.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from memrl_cli.bank.memory_bank import Retrieval
from memrl_cli.bank.records import check_task_id
from memrl_cli.errors import MemrlError

TASK_MESSAGES = ("first", "latest")
MEMRL_METADATA = ("memrl_task", "memrl_task_id", "memrl_scope")  # metadata keys the proxy reads, never forwards
REMEMBERED = 1024  # tasks (and response ids) kept, least recently used dropped first
TASK_EXPIRY = 24 * 3600.0  # seconds after its last call that a task is continued across a restart


@dataclass
class Task:
    """One task's shared retrieval: made by its first call, its receipt stored once an upstream answered."""

    text: str
    key: str = ""  # where the bank keeps it (`Call.key`)
    task_id: str | None = None  # the client's id for it, kept on the receipt
    scope: str | None = None  # whom it belongs to: its retrieval is limited to that scope
    calls: int = 0  # how many messages (or input items) its longest answered call carried
    in_flight: list[int] = field(default_factory=list)  # the message counts of its calls being answered
    retrieval: Retrieval | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def continued_by(self, calls: int) -> bool:
        """Whether a call with `calls` messages continues this conversation: more than its longest answered call
        (a retry of a failed call too), and not a copy of one being answered (the same task run twice at once)."""
        return calls > self.calls and calls not in self.in_flight


@dataclass(frozen=True)
class Call:
    """What one request says about its task: where the task is kept (`key`), the client's id for it, its text
    (None: the request has none), its scope, how many messages it carries, and the response it continues."""

    key: str
    task_id: str | None
    text: str | None
    scope: str | None
    messages: int
    previous: str | None

    @property
    def named(self) -> bool:
        """Whether the client named the task (every call under its id is the task, whatever its messages)."""
        return self.task_id is not None

    def keys(self) -> list[str]:
        """Where the bank may keep this call's task, in the order they decide: the response it continues (when
        the client named no task), then its own key."""
        return ([response_key(self.previous)] if self.previous and not self.named else []) + [self.key]


def response_key(response_id: str) -> str:
    """The key of the task a Responses API answer belongs to."""
    return "response:" + response_id


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


def client_task_id(body: dict[str, Any], headers: Any) -> str | None:
    """The client's id for the task: `X-Memrl-Task-Id`, `metadata.memrl_task_id`, or the Responses API's
    `conversation` (an id, or an object with one); checked (`check_task_id`)."""
    conv = body.get("conversation")
    conv = conv.get("id") if isinstance(conv, dict) else conv
    for value in (headers.get("x-memrl-task-id"), metadata_text(body, "memrl_task_id"), conv):
        if isinstance(value, str) and value.strip():
            return check_task_id(value.strip(), "the ")
    return None


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
    """The tasks the proxy has seen recently, by key, and which task each response id answered (for
    `previous_response_id`); `expiry`: seconds after its last call that the bank's copy of a task is used."""

    def __init__(self, task_message: str = "first", task_chars: int = 2000, remembered: int = REMEMBERED,
                 expiry: float = TASK_EXPIRY) -> None:
        if task_message not in TASK_MESSAGES:
            raise MemrlError(f"task_message must be one of {', '.join(TASK_MESSAGES)}, got {task_message!r}")
        if task_chars < 1:
            raise MemrlError(f"task_chars must be at least 1, got {task_chars}")
        if not expiry > 0:
            raise MemrlError(f"the task expiry must be a positive number of hours, got {expiry / 3600:g}")
        self.task_message = task_message
        self.task_chars = task_chars
        self.remembered = remembered
        self.expiry = expiry
        self._tasks: OrderedDict[str, Task] = OrderedDict()

    def _keep(self, key: str, task: Task) -> Task:
        self._tasks[key] = task
        self._tasks.move_to_end(key)
        while len(self._tasks) > self.remembered:
            self._tasks.popitem(last=False)
        return task

    def identify(self, body: dict[str, Any], headers: Any, scope: str | None) -> Call:
        """What this request says about its task (see the module's docstring)."""
        messages = conversation(body) or []
        task_id = client_task_id(body, headers)
        previous = body.get("previous_response_id")
        at = user_index(messages, self.task_message)
        named = headers.get("x-memrl-task") or metadata_text(body, "memrl_task")
        text = named if named and named.strip() else text_of(messages[at].get("content")) if at is not None else ""
        if task_id is not None:
            key = "id:" + json.dumps([scope, task_id], ensure_ascii=False)
        else:
            leading = messages[:at + 1] if at is not None else []
            key = "conversation:" + hashlib.sha256(json.dumps([scope, named, leading], sort_keys=True,
                                                              ensure_ascii=False, default=str).encode()).hexdigest()
        return Call(key, task_id, cap(text.strip(), self.task_chars) if text.strip() else None, scope, len(messages),
                    previous if isinstance(previous, str) else None)

    def find(self, call: Call) -> tuple[Task | None, bool]:
        """The task this call continues among those in memory (None: none), and whether it continues a response
        of that task (`previous_response_id`: its memories are already upstream)."""
        earlier = self._tasks.get(response_key(call.previous)) if call.previous else None
        known = self._tasks.get(call.key)
        if known is not None and call.named:  # a later call of a named task, whatever its text
            return self._keep(call.key, known), earlier is known
        if earlier is not None and not call.named:
            return earlier, True
        if known is not None and known.continued_by(call.messages):
            return self._keep(call.key, known), False
        return None, False

    def adopt(self, call: Call, key: str, calls: int, retrieval: Retrieval) -> tuple[Task | None, bool]:
        """The task the bank keeps under `key` (found by a restarted proxy) with its receipt read back, if this
        call continues it, and whether it continues one of its responses."""
        continued = key != call.key  # found by the response it continues
        if not continued and not call.named and call.messages <= calls:
            return None, False  # the same conversation from the start, once answered: a new task
        return self._keep(key, Task(retrieval.query, key, retrieval.task_id, retrieval.scope, calls,
                                    retrieval=retrieval)), continued

    def new(self, call: Call) -> Task | None:
        """A new task for this call (None when it has no task text)."""
        if call.text is None:
            return None
        return self._keep(call.key, Task(call.text, call.key, call.task_id, call.scope))

    def ended(self, task: Task) -> None:
        """Forget a task that ended (rewarded): its key opens a new task."""
        for key in [k for k, t in self._tasks.items() if t is task]:
            del self._tasks[key]

    def answered(self, response_id: str, task: Task) -> None:
        """Remember that `response_id` (a Responses API answer) belongs to `task`."""
        self._keep(response_key(response_id), task)
