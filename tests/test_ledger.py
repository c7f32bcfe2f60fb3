"""memrl_cli.bank.ledger alone, on both engines: rewards by receipt or by ids (all or none), the request
checks, outright Q, revisions; Q always equals the replay of its ledger."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from bank_parts import connect, seed, unit

from memrl_cli.errors import MemrlError
from memrl_cli.method.learning import q_update, replay
from memrl_cli.bank.ledger import Ledger, check_reward_request


def receipt(ledger: Ledger, selected: list[int]) -> int:
    """A receipt that selected `selected` (in that order), written straight into the bank."""
    with ledger.db.transaction() as conn:
        rid = ledger.db.store.insert("INSERT INTO retrievals (query, params, sim_mean, sim_std, explored, created_at) "
                                     "VALUES ('q', '{}', 0, 1, 0, 'now')", ())
        conn.executemany("INSERT INTO retrieval_candidates (retrieval_id, memory_id, recall_rank, similarity, q, "
                         "z_sim, z_q, score, selected_rank) VALUES (?, ?, ?, 1, 0, 0, 0, 0, ?)",
                         [(rid, mid, rank, rank) for rank, mid in enumerate(selected)])
    assert rid is not None
    return rid


def q_and_ledger(ledger: Ledger, mid: int) -> tuple[float, list[tuple]]:
    conn = ledger.db.conn
    q = conn.execute("SELECT q FROM memories WHERE id = ?", (mid,)).fetchone()[0]
    rows = conn.execute("SELECT kind, reward, alpha, q_floor, q_after FROM rewards WHERE memory_id = ? ORDER BY id",
                        (mid,)).fetchall()
    return float(q), [tuple(r) for r in rows]


def test_rewards_by_receipt_and_by_ids(bank_at: Callable[[str], str]) -> None:
    ledger = Ledger(connect(bank_at("b")))
    ids = seed(ledger.db, unit(4))
    rid = receipt(ledger, [ids[2], ids[0]])
    applied = ledger.reward_many([{"reward": 1.0, "retrieval_id": rid}])
    assert [(u["id"], u["q_before"], u["q_after"]) for u in applied] == [(3, 0.0, q_update(0.0, 1.0, 0.3)), (1, 0.0, 0.3)]
    with pytest.raises(MemrlError, match=f"retrieval {rid} was already rewarded"):
        ledger.reward_many([{"reward": 1.0, "retrieval_id": rid}])
    assert len(ledger.reward_many([{"reward": -1.0, "retrieval_id": rid, "allow_repeat": True}])) == 2
    ledger.reward_many([{"reward": 1.0, "memory_ids": [1, 2], "alpha": 0.5, "floor": -0.2},
                        {"reward": -1.0, "memory_ids": [2], "alpha": 0.5, "floor": -0.2}])
    ledger.reward_many([{"reward": 1.0, "memory_ids": [4, 3]}])  # each memory once: one statement on PostgreSQL
    for mid in ids:
        q, rows = q_and_ledger(ledger, mid)
        assert q == pytest.approx(replay(0.0, [{"kind": k, "reward": r, "alpha": a, "q_floor": f, "q_after": qa}
                                               for k, r, a, f, qa in rows]))
    assert q_and_ledger(ledger, 2)[0] == pytest.approx(-0.2)  # the floor held


def test_a_bad_request_changes_nothing(bank_at: Callable[[str], str]) -> None:
    ledger = Ledger(connect(bank_at("b")))
    seed(ledger.db, unit(2))
    for requests, message in (([{"reward": 1.0, "memory_ids": [1]}, {"reward": 1.0, "memory_ids": [99]}],
                               "unknown memory id 99"),
                              ([{"reward": 1.0, "memory_ids": [1]}, {"reward": 1.0, "retrieval_id": 7}],
                               "unknown retrieval id 7")):
        with pytest.raises(MemrlError, match=message):
            ledger.reward_many(requests)
    assert ledger.db.conn.execute("SELECT count(*), sum(visits) FROM memories").fetchone()[1] == 0
    assert ledger.db.conn.execute("SELECT count(*) FROM rewards").fetchone()[0] == 0


def test_rewards_stay_in_the_bank_s_range(bank_at: Callable[[str], str]) -> None:
    """[-1, 1] by default; the bank's meta widens it for every connection (the cache follows); a reward outside
    is refused with one line and nothing written, in a batch too; the range itself is checked."""
    location = bank_at("b")
    ledger, other = Ledger(connect(location)), Ledger(connect(location))
    seed(ledger.db, unit(2))
    rid = receipt(ledger, [1])

    def nothing_written() -> None:
        assert ledger.db.conn.execute("SELECT count(*) FROM rewards").fetchone()[0] == 0
        assert [r[0] for r in ledger.db.conn.execute("SELECT q FROM memories ORDER BY id")] == [0.0, 0.0]

    assert ledger.reward_range() == other.reward_range() == (-1.0, 1.0)
    for requests, message in (([{"reward": 5, "retrieval_id": rid}], "reward must be in [-1, 1] (the bank's reward "
                                                                     "range), got 5"),
                              ([{"reward": 1, "memory_ids": [2]}, {"reward": -1.5, "memory_ids": [1]}],
                               "reward 2: reward must be in [-1, 1] (the bank's reward range), got -1.5")):
        with pytest.raises(MemrlError) as caught:
            other.reward_many(requests)
        assert str(caught.value) == message
        nothing_written()
    for bad in ((1, 1), (2, -2), (float("nan"), 1), (0, float("inf")), (True, 2)):
        with pytest.raises(MemrlError, match="a reward range is two finite numbers MIN < MAX"):
            ledger.set_reward_range(bad)  # type: ignore[arg-type]
    assert ledger.set_reward_range((-5, 5)) == (-5.0, 5.0)
    assert other.reward_range() == (-5.0, 5.0)  # another connection sees it at once
    assert other.reward_many([{"reward": 5, "retrieval_id": rid}]) == [{"id": 1, "q_before": 0.0, "q_after": 1.5}]
    with pytest.raises(MemrlError, match="got 5.5"):
        other.reward_many([{"reward": 5.5, "memory_ids": [2]}])
    assert ledger.set_reward_range(None) == other.reward_range() == (-1.0, 1.0)
    with pytest.raises(MemrlError, match=r"in \[-1, 1\]"):
        other.reward_many([{"reward": 5, "memory_ids": [2]}])
    assert ledger.db.conn.execute("SELECT count(*) FROM rewards").fetchone()[0] == 1


@pytest.mark.parametrize("request_, message", [
    ({"reward": 1.0}, "give one of a retrieval id, memory ids or a task id"),
    ({"reward": 1.0, "retrieval_id": 1, "memory_ids": [1]}, "give one of a retrieval id, memory ids or a task id"),
    ({"reward": 1.0, "retrieval_id": 1, "task": "t"}, "give one of a retrieval id, memory ids or a task id"),
    ({"reward": 1.0, "task": ""}, "task id must be a non-empty string"),
    ({"reward": 1.0, "task": "t", "scope": "user:*"}, "scope 'user:*' contains a pattern character"),
    ({"reward": 1.0, "retrieval_id": True}, "retrieval id must be an integer"),
    ({"reward": 1.0, "memory_ids": []}, "memory ids must be a non-empty list of integers"),
    ({"reward": 1.0, "memory_ids": 5}, "memory ids must be a non-empty list of integers"),
    ({"reward": float("nan"), "memory_ids": [1]}, "reward"),
    ({"reward": 1.0, "memory_ids": [1], "weight": 2}, "unknown field(s) weight; use allow_repeat"),
    ({"reward": 1.01, "memory_ids": [1]}, "reward must be in [-1, 1] (the bank's reward range), got 1.01"),
])
def test_check_reward_request(request_: dict, message: str) -> None:
    with pytest.raises(MemrlError) as caught:
        check_reward_request(request_, 2)
    assert str(caught.value).startswith("reward 3: ") and message in str(caught.value)
    checked = check_reward_request({"reward": 1, "memory_ids": [2, 1, 2]}, 0)
    assert (checked.retrieval_id, checked.memory_ids, checked.task, checked.reward, checked.alpha) == \
        (None, [2, 1], None, 1.0, 0.3)
    assert not checked.scoped and check_reward_request({"reward": 1, "task": "t", "scope": None}, 0).scoped


def test_set_q_and_revise(bank_at: Callable[[str], str]) -> None:
    ledger = Ledger(connect(bank_at("b")))
    seed(ledger.db, unit(2))
    ledger.set_q(1, 0.75, "reset")
    assert q_and_ledger(ledger, 1) == (0.75, [("set", None, None, None, 0.75)])
    with pytest.raises(MemrlError, match="unknown memory id 9"):
        ledger.set_q(9, 0.0, "reset")
    with pytest.raises(MemrlError, match="q must be a finite number"):
        ledger.set_q(1, float("inf"), "reset")
    assert ledger.revise(1, "did it better") is True
    assert ledger.db.conn.execute("SELECT experience FROM memories WHERE id = 1").fetchone()[0] == "did it better"
    with ledger.db.transaction() as conn:
        conn.execute("UPDATE memories SET intent = 'task 0' WHERE id = 2")
    assert ledger.revise(2, "did it better") is False  # memory 1 holds exactly that content
    assert ledger.db.conn.execute("SELECT experience FROM memories WHERE id = 2").fetchone()[0] == "did 1"
    with pytest.raises(MemrlError, match="unknown memory id 9"):
        ledger.revise(9, "text")
