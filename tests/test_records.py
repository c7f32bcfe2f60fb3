"""memrl_cli.bank.records alone: what a bank accepts as a memory, and the row it stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from memrl_cli.errors import MemrlError
from memrl_cli.bank.records import (MAX_TEXT_BYTES, MEMORY_COLUMNS, MemoryInput, check_text, content_hash, memory_row,
                               now)
from memrl_cli.store import open_store


def test_parse_fills_defaults_and_keeps_the_fields() -> None:
    m = MemoryInput.parse({"intent": "heat an egg", "experience": "microwave", "task_id": 7, "q": 1,
                           "metadata": {"k": 1}, "vector": [1, 0.5]})
    assert (m.outcome, m.task_id, m.q, m.metadata, m.vector, m.source) == ("unknown", "7", 1.0, {"k": 1}, [1, 0.5], None)
    assert isinstance(m.q, float)


@pytest.mark.parametrize("record, message", [
    ([], "record 3: expected a JSON object, got list"),
    ({"intent": "a", "experience": "b", "colour": 1}, "record 3: unknown field(s) colour"),
    ({"intent": " ", "experience": "b"}, "record 3: intent must be a non-empty string"),
    ({"intent": "a", "experience": "b\x00c"}, "record 3: experience contains a NUL byte"),
    ({"intent": "a\ud800", "experience": "b"}, "record 3: intent is not valid UTF-8 text"),
    ({"intent": "a", "experience": "b", "outcome": "won"}, "record 3: outcome must be one of success, failure, unknown"),
    ({"intent": "a", "experience": "b", "q": True}, "record 3: q must be a finite number"),
    ({"intent": "a", "experience": "b", "q": float("nan")}, "record 3: q must be a finite number"),
    ({"intent": "a", "experience": "b", "task_id": [1]}, "record 3: task_id must be a string or an integer"),
    ({"intent": "a", "experience": "b", "metadata": [1]}, "record 3: metadata must be a JSON object"),
    ({"intent": "a", "experience": "b", "vector": [1, True]}, "record 3: vector must be a list of numbers"),
    ({"intent": "a", "experience": "b", "source": 3}, "record 3: source must be a string"),
])
def test_parse_refuses_each_bad_field_with_one_message(record: object, message: str) -> None:
    with pytest.raises(MemrlError) as caught:
        MemoryInput.parse(record, "record 3: ")
    assert str(caught.value).startswith(message)


def test_check_text_limits_the_size() -> None:
    assert check_text("x" * MAX_TEXT_BYTES, "query", "") == "x" * MAX_TEXT_BYTES
    with pytest.raises(MemrlError, match=f"query is longer than {MAX_TEXT_BYTES} bytes"):
        check_text("é" * (MAX_TEXT_BYTES // 2 + 1), "query", "")


def test_memory_row_lines_up_with_the_memories_table(tmp_path: Path) -> None:
    """The row goes into a real SQLite bank through the Store; every column reads back where it belongs."""
    store = open_store(str(tmp_path / "b.db"))
    item = MemoryInput("heat an egg", "microwave", "success", "t1", "agent", 0.5, {"k": 1}, scope="user:alice")
    imported = {"q_init": 0.25, "visits": 3, "created_at": "2020-01-01T00:00:00", "last_used_at": "2021-01-01T00:00:00"}
    stamp = now()
    store.begin()
    ids = store.insert_memories(MEMORY_COLUMNS, [memory_row(item, b"\0" * 16, stamp),
                                                 memory_row(item, b"\0" * 16, stamp, imported)])
    store.commit()
    assert ids[0] == 1 and ids[1] is None  # the same content: one memory
    row = dict(zip(MEMORY_COLUMNS, store.conn.execute(f"SELECT {', '.join(MEMORY_COLUMNS)} FROM memories").fetchone()))
    assert row == {"intent": "heat an egg", "experience": "microwave", "outcome": "success", "task_id": "t1",
                   "source": "agent", "q": 0.5, "q_init": 0.5, "visits": 0, "created_at": stamp, "updated_at": stamp,
                   "last_used_at": None, "metadata": '{"k": 1}', "content_hash": content_hash("heat an egg", "microwave", "user:alice"),
                   "scope": "user:alice", "embedding": b"\0" * 16}
    again = dict(zip(MEMORY_COLUMNS, memory_row(item, b"", stamp, imported)))
    assert (again["q_init"], again["visits"], again["created_at"], again["updated_at"], again["last_used_at"]) == \
        (0.25, 3, "2020-01-01T00:00:00", stamp, "2021-01-01T00:00:00")
    store.close()
