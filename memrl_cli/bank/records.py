"""What a bank accepts as a memory: validation of incoming records, and a memory's stored row.

`MemoryInput.parse` checks a dict (a JSONL line, API or tool arguments) field by field, with one
clear message per problem and nothing written; `memory_row` lays a validated memory out in
`MEMORY_COLUMNS` order for `Store.insert_memories`.
"""

from __future__ import annotations

import hashlib
import json
import math
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from memrl_cli.errors import MemrlError

OUTCOMES = ("success", "failure", "unknown")
MAX_TEXT_BYTES = 1_000_000
MEMORY_COLUMNS = ("intent", "experience", "outcome", "task_id", "source", "q", "q_init", "visits", "created_at",
                  "updated_at", "last_used_at", "metadata", "content_hash", "scope", "embedding")  # the vector last
MAX_SCOPE_CHARS = 200
MAX_TASK_ID = 1000
Progress = Callable[[int], None]


def now() -> str:
    """Current UTC time as ISO 8601 with microseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def content_hash(intent: str, experience: str, scope: str | None = None,
                 metadata: dict[str, Any] | None = None) -> str:
    """Identity of a memory's content: exact duplicates share it. The same text in two scopes is two
    memories (alice's and bob's); without a scope, the hash of older memrl. Two memories that each name
    their own episode (`metadata["episode"]`, set by a benchmark run whose `dedup` switch is off) are two."""
    episode = (metadata or {}).get("episode")
    key = f"{intent}\x00{experience}{'' if scope is None else chr(0) + scope}"
    return hashlib.sha256((key if episode is None else f"{key}\x00\x00episode:{episode}").encode()).hexdigest()


def check_text(value: Any, name: str, where: str) -> str:
    """`value` as a non-empty, valid UTF-8 text without NUL bytes, at most MAX_TEXT_BYTES long;
    else a MemrlError naming `name` (prefixed with `where`)."""
    if not isinstance(value, str) or not value.strip():
        raise MemrlError(f"{where}{name} must be a non-empty string")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
        raise MemrlError(f"{where}{name} is longer than {MAX_TEXT_BYTES} bytes")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise MemrlError(f"{where}{name} is not valid UTF-8 text") from None
    if "\x00" in value:
        raise MemrlError(f"{where}{name} contains a NUL byte (binary data is not text)")
    return value


def check_scope(value: Any, where: str = "") -> str | None:
    """A memory's scope: None, or a short text without the pattern characters `*`, `?` and `[` (so
    that a retrieval's scope pattern matches it unambiguously), e.g. `user:alice`, `agent:planner`."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_SCOPE_CHARS:
        raise MemrlError(f"{where}scope must be a non-empty string of at most {MAX_SCOPE_CHARS} characters")
    if any(c in value for c in "*?[\x00"):
        raise MemrlError(f"{where}scope {value!r} contains a pattern character (*, ? or [): those are for "
                         "retrieving, e.g. --scope 'team:*'")
    return value


def check_task_id(value: Any, where: str = "") -> str | None:
    """A caller's id for a task (what a receipt keeps, to reward it by task): None, or a non-blank text of
    at most MAX_TASK_ID characters without control characters (NUL, CR, LF, ...)."""
    if value is None:
        return None
    if (not isinstance(value, str) or not value.strip() or len(value) > MAX_TASK_ID
            or any(unicodedata.category(c) == "Cc" for c in value)):
        raise MemrlError(f"{where}task id must be a non-empty string of at most {MAX_TASK_ID} characters, "
                         "without control characters")
    return value


def _number_list(value: Any) -> bool:
    """A list of ints and floats (not bools); the type-set test first, as vectors are long."""
    return isinstance(value, list) and (set(map(type, value)) <= {int, float} or all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in value))


@dataclass
class MemoryInput:
    """A validated memory to store."""

    intent: str
    experience: str
    outcome: str = "unknown"
    task_id: str | None = None
    source: str | None = None
    q: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)
    vector: list[float] | None = None
    scope: str | None = None  # who the memory belongs to (`user:alice`): retrieval with scopes filters on it

    @classmethod
    def parse(cls, obj: Any, where: str = "") -> MemoryInput:
        """Validate a dict (a JSONL line, API arguments); `where` prefixes error messages."""
        if not isinstance(obj, dict):
            raise MemrlError(f"{where}expected a JSON object, got {type(obj).__name__}")
        unknown = set(obj) - {"intent", "experience", "outcome", "task_id", "source", "q", "metadata", "vector", "scope"}
        if unknown:
            raise MemrlError(f"{where}unknown field(s) {', '.join(sorted(unknown))}")
        outcome = obj.get("outcome") or "unknown"
        if outcome not in OUTCOMES:
            raise MemrlError(f"{where}outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
        task_id = obj.get("task_id")
        if task_id is not None and not isinstance(task_id, (str, int)):
            raise MemrlError(f"{where}task_id must be a string or an integer")
        q = obj.get("q", 0.0)
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not math.isfinite(q):
            raise MemrlError(f"{where}q must be a finite number, got {q!r}")
        metadata = obj.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise MemrlError(f"{where}metadata must be a JSON object")
        vector = obj.get("vector")
        if vector is not None and not _number_list(vector):
            raise MemrlError(f"{where}vector must be a list of numbers")
        source = obj.get("source")
        if source is not None and not isinstance(source, str):
            raise MemrlError(f"{where}source must be a string")
        return cls(check_text(obj.get("intent"), "intent", where), check_text(obj.get("experience"), "experience", where),
                   outcome, None if task_id is None else str(task_id), source, float(q), metadata, vector,
                   check_scope(obj.get("scope"), where))


@dataclass(frozen=True)
class IngestResult:
    """Where a memory went: its id, and False in `created` if it was an exact duplicate."""

    id: int
    created: bool


def memory_row(item: MemoryInput, encoded: Any, stamp: str, stored: dict[str, Any] | None = None) -> tuple[Any, ...]:
    """A memory's values in `MEMORY_COLUMNS` order, with its vector as the store encoded it (last).

    `stored` carries an imported memory's state (q_init, visits, timestamps); a new memory starts
    with q_init = q, no visits, and `stamp` as its creation and update time.
    """
    stored = stored or {}
    return (item.intent, item.experience, item.outcome, item.task_id, item.source, item.q,
            stored.get("q_init", item.q), stored.get("visits", 0), stored.get("created_at", stamp),
            stored.get("updated_at", stamp), stored.get("last_used_at"), json.dumps(item.metadata),
            content_hash(item.intent, item.experience, item.scope, item.metadata), item.scope, encoded)
