"""The everyday operations (memrl_cli.ops.memories) on both engines: scopes that retrieval filters on,
listing with filters, forget (a tombstone: never retrieved, ledger kept, verify green), edit (a new
version, Q carried), a memory's history, and the log of receipts with `reward --last`."""

from __future__ import annotations

import io
import json
from collections.abc import Callable

import pytest

from memrl_cli.ops import inspection
from memrl_cli.ops import memories
from memrl_cli.bank import MemoryBank
from memrl_cli.errors import MemrlError
from memrl_cli.method.retrieval import RetrieveParams
from memrl_cli.ops.transfer import export_jsonl, import_jsonl

E = [1.0, 0.0, 0.0, 0.0]
NEAR = [0.95, 0.3, 0.0, 0.0]
FAR = [0.0, 0.0, 1.0, 0.0]
ALL = RetrieveParams(k1=10, k2=10, threshold=-1.0, recall="memories")


def bank(location: str) -> MemoryBank:
    return MemoryBank(location, "external:test:4")


def ids(b: MemoryBank, params: RetrieveParams = ALL, vector: list[float] = E) -> list[int]:
    return sorted(m["id"] for m in b.retrieve("q", params, vector=vector, record=False).memories)


def test_scopes_are_stored_and_filtered_on_by_retrieval(bank_at: Callable[[str], str]) -> None:
    with bank(bank_at("b")) as b:
        alice = b.ingest("heat an egg", "microwave", scope="user:alice", vector=E).id
        bob = b.ingest("heat an egg", "microwave", scope="user:bob", vector=E)
        assert bob.created and bob.id != alice  # the same text in two scopes: two memories
        assert not b.ingest("heat an egg", "microwave", scope="user:bob", vector=E).created
        shared = b.ingest("heat an egg", "stove", scope="team:kitchen", source="wiki", vector=NEAR).id
        unscoped = b.ingest("heat an egg", "pan", vector=NEAR).id
        assert ids(b) == sorted([alice, bob.id, shared, unscoped])
        assert ids(b, RetrieveParams(k1=10, k2=10, threshold=-1.0, recall="memories", scopes=("user:alice",))) == [alice]
        assert ids(b, RetrieveParams(k1=10, k2=10, threshold=-1.0, scopes=("user:*", "team:kitchen"))) == \
            sorted([alice, bob.id, shared])  # grouped recall, patterns, any of them
        both = RetrieveParams(k1=10, k2=10, threshold=-1.0, scopes=("team:*",), sources=("wiki",))
        assert ids(b, both) == [shared]
        assert ids(b, RetrieveParams(k1=10, k2=10, threshold=-1.0, scopes=("user:carol",))) == []
        assert list(b.search(b.query_vector("q", E), 10, -1.0, scopes=["user:bob"])[0]) == [bob.id]
        for bad in ("user:*", "", "x" * 201):
            with pytest.raises(MemrlError, match="scope"):
                b.ingest("t", "e", scope=bad, vector=E)
        with pytest.raises(MemrlError, match="scopes must be non-empty"):
            RetrieveParams(scopes=("",))


def test_the_engine_index_filters_on_scope_too(bank_at: Callable[[str], str]) -> None:
    location = bank_at("b")
    with bank(location) as b:
        alice = b.ingest("a", "x", scope="user:alice", vector=E).id
        b.ingest("b", "y", scope="user:bob", vector=NEAR)
    kind = "vec" if "://" not in location else "hnsw"
    with MemoryBank(location, index=kind) as b:
        if kind == "vec" and not b.vec.loaded:
            pytest.skip("sqlite-vec is not loadable here")
        assert ids(b, RetrieveParams(k1=10, k2=10, threshold=-1.0, scopes=("user:alice",))) == [alice]
        memories.forget(b, [alice])
        assert ids(b, RetrieveParams(k1=10, k2=10, threshold=-1.0, scopes=("user:alice",))) == []


def test_export_and_import_carry_the_scope(bank_at: Callable[[str], str]) -> None:
    with bank(bank_at("a")) as a:
        a.ingest("t", "e", scope="user:alice", vector=E)
        a.ingest("u", "f", vector=NEAR)
        out = io.StringIO()
        export_jsonl(a, out, vectors=True)
    lines = [json.loads(line) for line in out.getvalue().splitlines()[1:]]
    assert [line.get("scope") for line in lines] == ["user:alice", None]
    assert "scope" not in lines[1]  # absent when unset: older memrl reads such exports
    with bank(bank_at("b")) as b:
        assert import_jsonl(b, io.BytesIO(out.getvalue().encode()))["created"] == 2
        assert [(m["intent"], m["scope"]) for m in memories.list_memories(b, order="oldest")] == \
            [("t", "user:alice"), ("u", None)]


def test_listing_filters_and_orders(bank_at: Callable[[str], str]) -> None:
    with bank(bank_at("b")) as b:
        one = b.ingest("Heat an EGG", "microwave 50%", outcome="success", source="web", q=0.8, vector=E).id
        two = b.ingest("cool a mug", "fridge", outcome="failure", source="wiki", scope="user:alice", q=-0.5,
                       vector=FAR).id
        three = b.ingest("clean a plate", "sink", q=0.1, vector=NEAR).id
        listed = memories.list_memories
        assert [m["id"] for m in listed(b)] == [three, two, one]
        assert [m["id"] for m in listed(b, order="q")] == [one, three, two]
        assert [m["id"] for m in listed(b, order="oldest", limit=2)] == [one, two]
        assert [m["id"] for m in listed(b, outcomes=["success", "failure"])] == [two, one]
        assert [m["id"] for m in listed(b, sources=["w*"], q_min=0)] == [one]
        assert [m["id"] for m in listed(b, q_min=-0.5, q_max=0.1)] == [three, two]
        assert [m["id"] for m in listed(b, scopes=["user:alice"])] == [two]
        assert [m["id"] for m in listed(b, text="egg")] == [one]  # case-insensitive, intent or experience
        assert [m["id"] for m in listed(b, text="FRIDGE")] == [two]
        assert [m["id"] for m in listed(b, text="50%")] == [one] and listed(b, text="5_%") == []  # literal
        for bad, message in (({"outcomes": ["won"]}, "outcome must be"), ({"order": "x"}, "order must be"),
                             ({"limit": 0}, "limit must be"), ({"q_min": 1, "q_max": 0}, "no memory can pass")):
            with pytest.raises(MemrlError, match=message):
                listed(b, **bad)  # type: ignore[arg-type]


def test_forget_erases_the_content_and_keeps_the_ledger(bank_at: Callable[[str], str]) -> None:
    with bank(bank_at("b")) as b:
        gone = b.ingest("heat an egg", "microwave", vector=E).id
        kept = b.ingest("heat an egg", "stove", vector=NEAR).id
        receipt = b.retrieve("q", ALL, vector=E)
        b.reward(1.0, retrieval_id=receipt.id)
        assert memories.forget(b, [gone, gone]) == {"forgotten": [gone], "unchanged": [], "erased": [gone],
                                                    "vacuumed": False}
        assert memories.forget(b, [gone, kept]) == {"forgotten": [kept], "unchanged": [gone], "erased": [kept],
                                                    "vacuumed": False}
        erased = inspection.memory(b, gone)
        assert (erased["intent"], erased["experience"], erased["metadata"]) == ("", "", {})
        vector = b.store.decode([b.store.rows_by_id("memories", "embedding", [gone])[0][0]])[0]
        assert not vector.any()  # the zero vector: nothing of the intent is left
        assert erased["q"] == pytest.approx(0.3) and erased["outcome"] == "unknown"  # the bookkeeping stays
        assert ids(b) == []  # neither retrieved, not even as a candidate
        assert b.retrieve("q", ALL, vector=E).candidates == []
        report = inspection.verify(b)
        assert report["ok"], report["problems"]
        assert report["ledger_rows"] == 2  # the rewards stay
        assert [r["kind"] for r in inspection.memory(b, gone)["ledger"]] == ["reward"]
        assert memories.list_memories(b) == []
        assert inspection.stats(b)["forgotten"] == 2
        assert [m["id"] for m in memories.list_memories(b, forgotten=True)] == [kept, gone]
        out = io.StringIO()
        assert export_jsonl(b, out) == 0  # gone for whoever reads the export
        again = b.ingest("heat an egg", "microwave", vector=E)
        assert again.created and again.id not in (gone, kept)  # its content no longer counts as stored
        assert ids(b) == [again.id]
        with pytest.raises(MemrlError, match="unknown memory id 99; nothing was changed"):
            memories.forget(b, [again.id, 99])
        assert ids(b) == [again.id]
        assert inspection.verify(b)["ok"]


def test_edit_writes_the_next_version_with_q_carried(bank_at: Callable[[str], str]) -> None:
    with bank(bank_at("b")) as b:
        first = b.ingest("heat an egg", "microwave", scope="user:alice", source="web", task_id="t1",
                         metadata={"k": 1}, vector=E).id
        b.reward(1.0, memory_ids=[first])
        done = memories.edit(b, first, experience="microwave, 30 s", outcome="success")
        second = done["id"]
        assert done == {"id": second, "replaces": first, "reembedded": False} and second != first
        new = inspection.memory(b, second)
        assert (new["experience"], new["outcome"], new["q"], new["q_init"], new["visits"], new["scope"], new["source"],
                new["task_id"], new["metadata"]) == ("microwave, 30 s", "success", 0.3, 0.3, 1, "user:alice", "web",
                                                     "t1", {"k": 1})
        assert ids(b) == [second]
        b.reward(1.0, memory_ids=[second])
        third = memories.edit(b, second, outcome="failure")["id"]  # the same texts: the old hash is freed first
        assert ids(b) == [third]
        hist = memories.history(b, first)
        assert [v["id"] for v in hist["versions"]] == [first, second, third] and hist["current"] == third
        assert memories.history(b, third)["versions"] == hist["versions"]  # any version finds them all
        assert [len(v["ledger"]) for v in hist["versions"]] == [1, 1, 0]
        assert [v["replaced_by"] for v in hist["versions"]] == [second, third, None]
        assert inspection.verify(b)["ok"]
        for kwargs, message in (({}, "what to change"), ({"outcome": "failure"}, "already reads so"),
                                ({"outcome": "won"}, "outcome must be")):
            with pytest.raises(MemrlError, match=message):
                memories.edit(b, third, **kwargs)
        with pytest.raises(MemrlError, match=f"forgotten; its current version is {third}"):
            memories.edit(b, first, outcome="unknown")
        other = b.ingest("cool a mug", "fridge", scope="user:alice", vector=FAR).id  # the same scope
        with pytest.raises(MemrlError, match=f"memory {other} already holds exactly that content"):
            memories.edit(b, third, intent="cool a mug", experience="fridge", vector=FAR)
        with pytest.raises(MemrlError, match="pass a vector"):  # an external embedder cannot embed the new intent
            memories.edit(b, third, intent="warm an egg")
        with pytest.raises(MemrlError, match="give --intent too"):
            memories.edit(b, third, experience="pan", vector=FAR)
        moved = memories.edit(b, third, intent="warm an egg", vector=NEAR)
        assert moved["reembedded"] and ids(b, vector=NEAR)[-1] == moved["id"]
        third = moved["id"]
        memories.forget(b, [third])
        assert memories.history(b, second)["current"] is None
        with pytest.raises(MemrlError, match="unknown memory id 99"):
            memories.history(b, 99)


def test_an_edited_intent_is_embedded_again(tmp_path) -> None:
    with MemoryBank(str(tmp_path / "b.db")) as b:  # the local embedder
        first = b.ingest("heat an egg in the microwave", "30 s").id
        assert memories.edit(b, first, intent="cool a mug in the fridge")["reembedded"]
        found = b.retrieve("put a mug in the fridge to cool it", RetrieveParams(k2=1, threshold=0.3), record=False)
        assert [m["intent"] for m in found.memories] == ["cool a mug in the fridge"]
        assert inspection.verify(b)["ok"]


def test_the_log_of_receipts_and_the_newest(bank_at: Callable[[str], str]) -> None:
    """`reward --last` is the newest receipt, full stop: refused (one line) when it selected nothing or was rewarded,
    never another, older receipt in its place."""
    with bank(bank_at("b")) as b:
        with pytest.raises(MemrlError, match="no retrieval yet"):
            memories.newest_receipt(b)
        mid = b.ingest("heat an egg", "microwave", vector=E).id
        first = b.retrieve("heat an egg", ALL, vector=E, task_id="ticket-1").id
        second = b.retrieve("warm an egg", ALL, vector=E).id
        assert memories.newest_receipt(b)["id"] == second
        empty = b.retrieve("nothing", RetrieveParams(threshold=0.99), vector=FAR).id  # selected nothing
        log = memories.receipts(b)
        assert [r["id"] for r in log] == [empty, second, first]
        assert log[1] | {"created_at": None} == {"id": second, "task_id": None, "scope": None, "query": "warm an egg",
                                                 "created_at": None, "explored": False, "memories": [mid],
                                                 "rewarded": False, "reward": None, "rewarded_at": None}
        assert log[2]["task_id"] == "ticket-1"
        with pytest.raises(MemrlError, match=rf'^the newest receipt is retrieval {empty} \("nothing"\): it selected '
                                             "no memories"):
            memories.newest_receipt(b)  # not the one before it
        third = b.retrieve("heat an egg", ALL, vector=E, task_id="ticket-2").id
        b.reward(-1.0, retrieval_id=third)
        with pytest.raises(MemrlError, match=rf'^the newest receipt is retrieval {third} \(task ticket-2: "heat an egg"'
                                             r'\): it was already rewarded; nothing was written'):
            memories.newest_receipt(b)
        assert memories.newest_receipt(b, allow_repeat=True)["id"] == third
        log = memories.receipts(b, 2)
        assert [(r["id"], r["rewarded"], r["reward"]) for r in log] == [(third, True, -1.0), (empty, False, None)]
        assert [r["id"] for r in memories.receipts(b, unrewarded=True)] == [second, first]
        with pytest.raises(MemrlError, match="count must be"):
            memories.receipts(b, 0)
