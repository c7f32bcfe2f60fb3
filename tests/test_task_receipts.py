"""Receipts that know their task, on both engines: the task id and scope a receipt keeps, a reward by task id
(the newest receipt of the id, in its scope), requests that act in one scope alone, the tasks table a server
keeps open until a reward ends them, retrieval limited to no scope, an initial Q within the reward range,
rewards of forgotten memories, and `forget` erasing text and vector (indexes, verify, export, import, merge,
and with `--vacuum` the file itself)."""

from __future__ import annotations

import io
import os
from collections.abc import Callable

import pytest

from memrl_cli.bank import MemoryBank
from memrl_cli.bank.ledger import RewardedAlready
from memrl_cli.errors import MemrlError
from memrl_cli.method.retrieval import RetrieveParams
from memrl_cli.ops import inspection, memories
from memrl_cli.ops.transfer import export_jsonl, import_jsonl, merge
from served import learned_state

EGG, PLANT, OTHER = [1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]
ONE = RetrieveParams(k1=5, k2=1, threshold=0.5)


def bank(location: str) -> MemoryBank:
    return MemoryBank(location, "external:test:4")


def q_of(b: MemoryBank) -> dict[int, float]:
    return {int(i): float(q) for i, q, _ in b.store.q_and_initial_q()}


def test_a_reward_by_task_reaches_that_task_alone(bank_at: Callable[[str], str]) -> None:
    """Two tasks in flight, each rewarded by its own task id: only its memories' Q move; a second reward of one
    task is refused; the id used again opens a new receipt, which its next reward reaches."""
    with bank(bank_at("b")) as b:
        egg = b.ingest("heat an egg", "microwave 30 s", "success", vector=EGG).id
        plant = b.ingest("water the plants", "a can, each pot", "success", vector=PLANT).id
        first = b.retrieve("heat an egg", ONE, vector=EGG, task_id="ticket-egg")
        second = b.retrieve("water the plants", ONE, vector=PLANT, task_id="ticket-plant")
        assert [m["id"] for m in first.memories] == [egg] and first.task_id == "ticket-egg"
        assert b.store.receipt(second.id or 0)["task_id"] == "ticket-plant"  # type: ignore[index]
        assert b.reward(1.0, task="ticket-plant") == [{"id": plant, "q_before": 0.0, "q_after": 0.3}]
        assert q_of(b) == {egg: 0.0, plant: 0.3}
        assert b.reward_many([{"task": "ticket-egg", "reward": -1}]) == [{"id": egg, "q_before": 0.0, "q_after": -0.3}]
        with pytest.raises(RewardedAlready):
            b.reward(1.0, task="ticket-egg")
        again = b.retrieve("heat an egg", ONE, vector=EGG, task_id="ticket-egg")
        assert b.task_receipt("ticket-egg") == again.id
        b.reward(1.0, task="ticket-egg")
        assert [r["retrieval_id"] for r in b.store.memory_ledger(egg)] == [first.id, again.id]
        with pytest.raises(MemrlError, match="^no retrieval has task id 'nope'; see `memrl log`$"):
            b.reward(1.0, task="nope")
        assert inspection.verify(b)["ok"]


def test_a_request_with_a_scope_acts_in_it_alone(bank_at: Callable[[str], str]) -> None:
    """The same task id in two scopes is two tasks; a reward names the scope (or is refused when the id is in
    several); a request that acts in a scope cannot reward another scope's receipt or memory."""
    with bank(bank_at("b")) as b:
        alice = b.ingest("heat an egg", "alice's way", vector=EGG, scope="user:alice").id
        bob = b.ingest("heat an egg", "bob's way", vector=EGG, scope="user:bob").id
        shared = b.ingest("heat an egg", "anyone's way", vector=EGG).id
        mine = b.retrieve("heat an egg", RetrieveParams(k2=3, scopes=("user:alice",)), vector=EGG, task_id="t",
                          scope="user:alice")
        theirs = b.retrieve("heat an egg", RetrieveParams(k2=3, scopes=("user:bob",)), vector=EGG, task_id="t",
                            scope="user:bob")
        unscoped = b.retrieve("heat an egg", RetrieveParams(k2=3, scopes=(None,)), vector=EGG)
        assert ([m["id"] for m in mine.memories], [m["id"] for m in theirs.memories]) == ([alice], [bob])
        assert [m["id"] for m in unscoped.memories] == [shared]  # no scope: only the memories without one
        before = learned_state(b.path)
        with pytest.raises(MemrlError, match=r"task id 't' was retrieved for in several scopes \(user:bob, user:alice\)"):
            b.reward(1.0, task="t")
        for request, message in (
                ({"retrieval_id": mine.id, "scope": "user:bob"}, f"retrieval {mine.id} was retrieved in scope "
                                                                  "user:alice, not in scope user:bob"),
                ({"retrieval_id": mine.id, "scope": None}, "not without a scope"),
                ({"memory_ids": [alice], "scope": "user:bob"}, f"memory {alice} is in scope user:alice, not in scope "
                                                                "user:bob"),
                ({"task": "t", "scope": None}, "no retrieval has task id 't' without a scope")):
            with pytest.raises(MemrlError, match=message):
                b.reward_many([{**request, "reward": 1}])
        assert learned_state(b.path) == before  # nothing written
        assert b.reward_many([{"task": "t", "scope": "user:bob", "reward": 1}]) == [
            {"id": bob, "q_before": 0.0, "q_after": 0.3}]
        assert b.task_receipt("t", "user:alice", any_scope=False) == mine.id
        assert b.reward_many([{"memory_ids": [shared], "scope": None, "reward": 1}])[0]["id"] == shared


def test_a_reward_ends_the_task_a_server_keeps_open(bank_at: Callable[[str], str]) -> None:
    """The tasks table: a key names an open task's receipt until a reward of that receipt (one that selected
    nothing too) ends it; a key used again names the new task; old entries expire."""
    with bank(bank_at("b")) as b:
        b.ingest("heat an egg", "microwave", vector=EGG)
        hit = b.retrieve("heat an egg", ONE, vector=EGG)
        empty = b.retrieve("fix the car", ONE, vector=OTHER)  # selected nothing
        with b.transaction():
            b.store.open_task("id:a", hit.id, 2, "2026-01-01T00:00:00+00:00")  # type: ignore[arg-type]
            b.store.open_task("conversation:b", empty.id, 2, "2026-01-01T00:00:00+00:00")  # type: ignore[arg-type]
            b.store.touch_tasks([("response:r1", hit.id, 0), ("id:a", hit.id, 4)], "2026-01-02T00:00:00+00:00")  # type: ignore[list-item]
        assert sorted(b.store.open_tasks(["id:a", "conversation:b", "response:r1"], "2026-01-01T12:00:00+00:00")) == \
            [("id:a", hit.id, 4), ("response:r1", hit.id, 0)]  # conversation:b is older: expired
        assert not b.store.task_ended(hit.id)  # type: ignore[arg-type]
        b.reward(1.0, retrieval_id=hit.id)
        assert b.store.task_ended(hit.id) and b.store.open_tasks(["id:a", "response:r1"], "") == []  # type: ignore[arg-type]
        assert b.reward(1.0, retrieval_id=empty.id) == [] and b.store.task_ended(empty.id)  # type: ignore[arg-type]
        new = b.retrieve("heat an egg", ONE, vector=EGG)
        with b.transaction():
            b.store.open_task("id:a", new.id, 2, "2026-01-03T00:00:00+00:00")  # type: ignore[arg-type]
            b.store.touch_tasks([("id:a", hit.id, 9)], "2026-01-04T00:00:00+00:00")  # type: ignore[list-item]
            b.store.prune_tasks("2026-01-02T12:00:00+00:00")
        assert b.store.open_tasks(["id:a", "response:r1", "conversation:b"], "") == [("id:a", new.id, 2)]


def test_an_initial_q_lies_in_the_reward_range(bank_at: Callable[[str], str]) -> None:
    with bank(bank_at("b")) as b:
        with pytest.raises(MemrlError, match=r"^q 7 is outside the bank's reward range \[-1, 1\]"):
            b.ingest("heat an egg", "microwave", q=7, vector=EGG)
        with pytest.raises(MemrlError, match=r"^record 2: q -1.5 is outside"):
            b.ingest_many([{"intent": "a", "experience": "b", "vector": EGG},
                           {"intent": "c", "experience": "d", "q": -1.5, "vector": EGG}])
        assert b.count() == 0
        b.set_reward_range((-10, 10))
        assert b.ingest("heat an egg", "microwave", q=7, vector=EGG).created
        b.set_reward_range((1, 5))  # (star ratings): the default initial Q, 0, is taken as always
        assert b.ingest("boil an egg", "pot", vector=EGG).created


def test_rewarding_a_forgotten_memory_says_so(bank_at: Callable[[str], str]) -> None:
    with bank(bank_at("b")) as b:
        gone = b.ingest("heat an egg", "microwave", vector=EGG).id
        receipt = b.retrieve("heat an egg", ONE, vector=EGG)
        edited = memories.edit(b, b.ingest("boil an egg", "pot", vector=PLANT).id, experience="pot, 8 min")["id"]
        memories.forget(b, [gone])
        with pytest.raises(MemrlError, match=f"^memory {gone} is forgotten: it is never retrieved again, so a reward "
                                             "would teach nothing; nothing was written$"):
            b.reward(1.0, memory_ids=[gone])
        with pytest.raises(MemrlError, match=f"was replaced by memory {edited} \\(memrl edit\\): reward that"):
            b.reward(1.0, memory_ids=[edited - 1])
        # a late reward of a receipt still lands (Q stays the replay of the ledger), and says the memory is forgotten
        assert b.reward(1.0, retrieval_id=receipt.id) == [{"id": gone, "q_before": 0.0, "q_after": 0.3,
                                                          "forgotten": True}]
        assert inspection.verify(b)["ok"]


def test_forget_erases_text_and_vector_everywhere(bank_at: Callable[[str], str], tmp_path: object) -> None:
    """Text, metadata and vector erased (the engine's index too, and the earlier versions of an edited memory);
    id, Q and ledger kept; verify, export, import and merge still hold; retrieval never sees it."""
    location = bank_at("b")
    with bank(location) as b:
        secret = b.ingest("zebra quartz pass phrase", "the code is 4711", metadata={"note": "zebra"}, vector=EGG).id
        kept = b.ingest("heat an egg", "microwave", vector=[0.9, 0.1, 0.0, 0.0]).id
        b.reward(1.0, retrieval_id=b.retrieve("zebra", ONE, vector=EGG).id)
        old = b.ingest("old secret", "v1", vector=PLANT).id
        current = memories.edit(b, old, experience="v2")["id"]
        b.set_index("hnsw" if b.is_server else "vec")
        done = memories.forget(b, [secret, current])
        assert done["erased"] == sorted([secret, old, current]) and done["forgotten"] == [secret, current]
        for mid in (secret, old, current):
            row = inspection.memory(b, mid)
            assert (row["intent"], row["experience"], row["metadata"]) == ("", "", {}), row
        assert inspection.memory(b, secret)["q"] == pytest.approx(0.3) and len(b.store.memory_ledger(secret)) == 1
        report = inspection.verify(b)
        assert report["ok"], report["problems"]
        hit = b.retrieve("q", RetrieveParams(k1=10, k2=10, threshold=-1.0), vector=EGG, record=False)
        assert [m["id"] for m in hit.memories] == [kept]
        assert memories.forget(b, [secret], vacuum=True)["unchanged"] == [secret]  # VACUUM (FULL) on either engine
        assert inspection.verify(b)["ok"]
        out = io.StringIO()
        assert export_jsonl(b, out, vectors=True) == 1 and "zebra" not in out.getvalue()
    with bank(bank_at("copy")) as c:
        assert import_jsonl(c, io.BytesIO(out.getvalue().encode()))["created"] == 1
        assert inspection.verify(c)["ok"]
    if not location.startswith("postgres"):
        merged = os.path.join(str(tmp_path), "merged.db")
        merge(location, location.replace("b.db", "copy.db"), merged)
        with MemoryBank(merged, create=False) as m:
            assert inspection.verify(m)["ok"] and m.count() == 4  # b's four rows (erased ones kept), copy's one merged


def test_forget_with_vacuum_leaves_no_byte_in_the_file(tmp_path: object) -> None:
    location = os.path.join(str(tmp_path), "b.db")
    with bank(location) as b:
        secret = b.ingest("zebra quartz pass phrase", "the code is xylophone-4711", vector=EGG).id
        b.ingest("heat an egg", "microwave", vector=PLANT)
        b.store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()  # the text is in the file itself now
        assert _in_files(location, b"xylophone-4711")
        assert memories.forget(b, [secret], vacuum=True)["vacuumed"] is True
        assert not _in_files(location, b"xylophone-4711") and not _in_files(location, b"zebra quartz")
        assert inspection.verify(b)["ok"] and b.count() == 2


def test_forget_with_vacuum_says_when_a_reader_kept_the_bytes(tmp_path: object) -> None:
    """A reader's snapshot keeps the last checkpoint from copying the WAL whole: `vacuumed` is then False
    (the text is still in a file), and True once the bank is quiet."""
    location = os.path.join(str(tmp_path), "b.db")
    with MemoryBank(location, "external:test:4", busy_timeout=0.5) as b, bank(location) as reader:  # (its waits)
        secret = b.ingest("zebra quartz pass phrase", "the code is xylophone-4711", vector=EGG).id
        b.ingest("heat an egg", "microwave", vector=PLANT)
        reader.store.conn.execute("BEGIN")
        reader.store.conn.execute("SELECT count(*) FROM memories").fetchall()  # a read snapshot held open
        assert memories.forget(b, [secret], vacuum=True)["vacuumed"] is False
        assert _in_files(location, b"xylophone-4711")
        reader.store.conn.execute("COMMIT")
        assert b.store.vacuum() is True
        assert not _in_files(location, b"xylophone-4711")


def _in_files(location: str, needle: bytes) -> bool:
    """Whether the bank's file, or its WAL, holds these bytes."""
    return any(os.path.exists(path) and needle in open(path, "rb").read() for path in (location, location + "-wal"))
