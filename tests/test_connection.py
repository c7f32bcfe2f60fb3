"""memrl_cli.bank.connection alone, on both engines: transactions and their savepoints, read-only refusal,
caches that another connection's commit invalidates, and the chunked id reads."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from bank_parts import connect, seed, unit

from memrl_cli.errors import MemrlError


def test_a_caught_inner_failure_rolls_back_only_the_inner_block(bank_at: Callable[[str], str]) -> None:
    db = connect(bank_at("b"))
    with db.transaction() as conn:
        conn.execute("INSERT INTO meta (key, value) VALUES ('outer', '1')")
        with pytest.raises(MemrlError):
            with db.transaction():
                conn.execute("INSERT INTO meta (key, value) VALUES ('inner', '1')")
                raise MemrlError("inner step failed")
        assert db.depth == 1
    assert (db.meta("outer"), db.meta("inner")) == (1, None)
    with pytest.raises(ZeroDivisionError):
        with db.transaction() as conn:
            conn.execute("INSERT INTO meta (key, value) VALUES ('lost', '1')")
            1 / 0
    assert db.meta("lost") is None and db.depth == 0


def test_a_read_only_connection_refuses_writes(bank_at: Callable[[str], str]) -> None:
    location = bank_at("b")
    connect(location).store.close()
    db = connect(location, readonly=True)
    for write in (lambda: db.transaction().__enter__(), lambda: db.single_statement(lambda: None)):
        with pytest.raises(MemrlError, match="was opened read-only"):
            write()


def test_caches_last_until_a_commit_here_or_elsewhere(bank_at: Callable[[str], str]) -> None:
    location = bank_at("b")
    reader, writer = connect(location), connect(location)
    calls: list[int] = []

    def counted() -> int:
        calls.append(1)
        return reader.count()

    assert reader.cached("n", counted) == 0 and reader.cached("n", counted) == 0 and len(calls) == 1
    seed(writer, unit(3))  # another connection commits: the reader's token changes
    assert reader.cached("n", counted) == 3 and len(calls) == 2
    with reader.one_version():  # one token for a whole call, even across a commit elsewhere
        assert reader.count() == 3
        seed(writer, unit(2, seed=1))
        assert reader.count() == 3
    assert reader.count() == 5
    with reader.transaction():  # inside a write, always fresh
        assert reader.cached("n", counted) == 5 and len(calls) == 3


def test_by_ids_reads_in_chunks_and_lock_holds_the_rows(bank_at: Callable[[str], str]) -> None:
    db = connect(bank_at("b"))
    ids = seed(db, unit(1203))
    wanted = set(ids[::2]) | {99_999}
    rows = db.by_ids("id, intent", "memories", wanted)
    assert [r[0] for r in rows] == sorted(wanted - {99_999})
    assert rows[0][1] == "task 0"
    with db.transaction():
        db.lock("memories", set(ids))  # FOR UPDATE on PostgreSQL, nothing on SQLite: no error either way
        assert len(db.store.rows_by_id("memories", "id", ids, lock=True)) == 1203
