"""MemoryBank through its Python API: ingest, two-phase retrieval with learned Q, rewards,
calibration, concurrency, the numpy fallback, and refusing untrusted or newer files.

Tests that take `bank_at` run on SQLite and on PostgreSQL (tests/conftest.py); the rest are
about the SQLite file itself (tampering, schema, in-process indexes, sqlite-vec).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from memrl_cli.ops import runs
from memrl_cli.store import migrations as schema
from memrl_cli.bank import MemoryBank
from memrl_cli.errors import MemrlError
from memrl_cli.ops.inspection import memory as memory_view
from memrl_cli.ops.inspection import verify
from memrl_cli.method.learning import q_update, replay
from memrl_cli.method.retrieval import RetrieveParams

QUERY = "heat an apple in the microwave"
DISTRACTOR = "heat an apple in the microwave oven"  # nearly the query
USEFUL = "heat some apple slices"  # clearly less similar
FILLERS = ["wash a plate in the sink", "find two pillows and put them on the sofa",
           "examine the book under the desk lamp", "put a clean knife in the drawer",
           "cool a tomato and put it on the counter", "write a python function that sorts a list",
           "list the files in /tmp", "select all users older than 30 from the table"]


def unit(rng: np.random.Generator, n: int, dim: int = 16) -> np.ndarray:
    v = rng.normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def vector_bank(location: str, n: int = 20, dim: int = 16, seed: int = 0) -> np.ndarray:
    """A bank of `n` memories with given random vectors (embedder external:test:DIM)."""
    vectors = unit(np.random.default_rng(seed), n, dim)
    with MemoryBank(location, f"external:test:{dim}") as bank:
        bank.ingest_many([{"intent": f"task {i}", "experience": f"did {i}", "vector": v.tolist()}
                          for i, v in enumerate(vectors)])
    return vectors


def make_text_bank(location: str) -> str:
    """A bank built with the real local embedder: a near-duplicate distractor, a useful memory, fillers."""
    with MemoryBank(location) as bank:
        bank.ingest_many([{"intent": t, "experience": f"how I did: {t}"} for t in [DISTRACTOR, USEFUL, *FILLERS]])
    return location


@pytest.fixture
def text_bank(bank_at: Callable[[str], str]) -> str:
    """`make_text_bank` on the engine under test."""
    return make_text_bank(bank_at("bank"))


@pytest.fixture
def sqlite_text_bank(tmp_path: Path) -> str:
    """`make_text_bank` in a SQLite file, for tests of the file and its in-process indexes."""
    return make_text_bank(str(tmp_path / "bank.db"))


# -- ingest -----------------------------------------------------------------------------------


def test_ingest_stores_memory_and_reports_duplicates(bank_at: Callable[[str], str]) -> None:
    with MemoryBank(bank_at("b")) as bank:
        first = bank.ingest("heat an apple", "microwave it", "success", task_id="t1", metadata={"steps": 3})
        again = bank.ingest("heat an apple", "microwave it", "failure")
        other = bank.ingest("heat an apple", "use the stove")
        assert (first.created, again.created, other.created) == (True, False, True)
        assert again.id == first.id and other.id != first.id
        assert bank.count() == 2
        row = memory_view(bank, first.id)
        assert (row["outcome"], row["task_id"], row["metadata"], row["q"], row["visits"]) == \
            ("success", "t1", {"steps": 3}, 0.0, 0)
        blob = bank.conn.execute("SELECT embedding FROM memories WHERE id = ?", (first.id,)).fetchone()[0]
        vector = bank.store.decode([blob])[0]
        assert vector.shape == (384,) and abs(float(np.linalg.norm(vector)) - 1) < 1e-5
        assert bank.meta("embedder")["spec"] == "local"


@pytest.mark.parametrize("record, message", [
    ({"intent": "", "experience": "x"}, "intent must be a non-empty string"),
    ({"intent": "a", "experience": "x", "outcome": "won"}, "outcome must be one of"),
    ({"intent": "a", "experience": "x", "q": float("nan")}, "q must be a finite number"),
    ({"intent": "a", "experience": "x\x00y"}, "experience contains a NUL byte"),
    ({"intent": "a", "experience": "x", "colour": "red"}, "unknown field(s) colour"),
])
def test_ingest_refuses_bad_records_atomically(bank_at: Callable[[str], str], record: dict, message: str) -> None:
    with MemoryBank(bank_at("b"), "external:t:4") as bank:
        bank.ingest("kept", "kept", vector=[1, 0, 0, 0])
        with pytest.raises(MemrlError, match="record 2: " + message.replace("(", r"\(").replace(")", r"\)")):
            bank.ingest_many([{"intent": "new", "experience": "new", "vector": [0, 1, 0, 0]}, record])
        assert bank.count() == 1


# -- two-phase retrieval with learned Q ------------------------------------------------------------


def test_learned_value_beats_a_more_similar_distractor(text_bank: str) -> None:
    """The MemRL loop under the paper's rule: the near-duplicate fails, gets negative Q, and loses to the useful
    memory. With two candidates, z(sim) and z(Q) over the candidates are ±1 each: at λ 0.5 one failure makes a
    tie, which goes to the more similar memory; above 0.5 the learned value wins."""
    half = RetrieveParams(k1=2, k2=1, lam=0.5, threshold=0.0)
    greedy = RetrieveParams(k1=2, k2=1, lam=0.6, threshold=0.0)
    rag = RetrieveParams(k1=2, k2=1, lam=0.0, threshold=0.0)
    with MemoryBank(text_bank) as bank:
        ids = {row[1]: row[0] for row in bank.conn.execute("SELECT id, intent FROM memories")}
        first = bank.retrieve(QUERY, half)
        assert [c.memory_id for c in first.candidates] == [ids[DISTRACTOR], ids[USEFUL]]
        assert [c.z_sim for c in first.candidates] == pytest.approx([1.0, -1.0])
        assert [m["id"] for m in first.memories] == [ids[DISTRACTOR]]  # equal Q: similarity decides
        assert bank.reward(-1.0, retrieval_id=first.id) == [{"id": ids[DISTRACTOR], "q_before": 0.0, "q_after": -0.3}]

        tied = bank.retrieve(QUERY, half)
        assert [c.score for c in tied.candidates] == pytest.approx([0.0, 0.0])
        assert [m["id"] for m in tied.memories] == [ids[DISTRACTOR]]  # a tie goes to the more similar
        second = bank.retrieve(QUERY, greedy)
        assert [m["id"] for m in second.memories] == [ids[USEFUL]]
        bank.reward(1.0, retrieval_id=second.id)
        third = bank.retrieve(QUERY, greedy)
        assert [m["id"] for m in third.memories] == [ids[USEFUL]]
        best = third.memories[0]
        assert best["q"] == pytest.approx(0.3) and best["score"] == pytest.approx(0.4 * -1.0 + 0.6 * 1.0)

        plain = bank.retrieve(QUERY, rag)
        assert [m["id"] for m in plain.memories] == [ids[DISTRACTOR]]
        assert plain.memories[0]["score"] == pytest.approx(1.0)


def test_retrieve_results_are_best_first_with_receipt(text_bank: str) -> None:
    with MemoryBank(text_bank) as bank:
        result = bank.retrieve(QUERY, RetrieveParams(k1=5, k2=3, threshold=-1.0))
        scores = [m["score"] for m in result.memories]
        assert len(scores) == 3 and scores == sorted(scores, reverse=True)
        assert set(result.memories[0]) == {"id", "intent", "experience", "outcome", "similarity", "q", "score"}
        stored = bank.conn.execute("SELECT count(*), count(selected_rank) FROM retrieval_candidates "
                                   "WHERE retrieval_id = ?", (result.id,)).fetchone()
        assert stored == (5, 3)
        assert bank.retrieve(QUERY, record=False).id is None
        assert bank.conn.execute("SELECT count(*) FROM retrievals").fetchone()[0] == 1


def test_threshold_and_k1_larger_than_bank(text_bank: str) -> None:
    with MemoryBank(text_bank) as bank:
        everything = bank.retrieve(QUERY, RetrieveParams(k1=100, k2=100, threshold=-1.0), record=False)
        assert len(everything.memories) == bank.count() == 10
        strict = bank.retrieve(QUERY, RetrieveParams(k1=100, k2=100, threshold=0.9), record=False)
        assert [m["intent"] for m in strict.memories] == [DISTRACTOR]
        assert bank.retrieve(QUERY, RetrieveParams(threshold=1.0), record=False).memories == []


def test_empty_bank_retrieves_nothing(bank_at: Callable[[str], str]) -> None:
    with MemoryBank(bank_at("empty")) as bank:
        result = bank.retrieve("anything")
        assert result.memories == [] and result.id is not None


def test_copied_file_gives_the_same_retrieval(sqlite_text_bank: str, tmp_path: Path) -> None:
    params = RetrieveParams(k1=5, k2=3, threshold=0.0)
    with MemoryBank(sqlite_text_bank) as bank:
        bank.reward(0.8, memory_ids=[2, 3])
        before = bank.retrieve(QUERY, params, record=False).memories
    elsewhere = tmp_path / "elsewhere" / "deeper"
    elsewhere.mkdir(parents=True)
    shutil.copy(sqlite_text_bank, elsewhere / "copy.db")
    with MemoryBank(elsewhere / "copy.db") as copy:
        after = copy.retrieve(QUERY, params, record=False).memories
        assert verify(copy)["ok"]
    assert after == before


def test_vec_and_numpy_indexes_agree(tmp_path: Path) -> None:
    vectors = vector_bank(str(tmp_path / "b.db"), n=300, dim=32)
    query = (vectors[5] + 0.3 * vectors[9]).tolist()
    results = {}
    for index in ("vec", "numpy"):
        with MemoryBank(tmp_path / "b.db", index=index) as bank:
            results[index] = bank.retrieve("q", RetrieveParams(k1=10, k2=5, threshold=-1.0), vector=query,
                                           record=False).memories
    assert [m["id"] for m in results["vec"]] == [m["id"] for m in results["numpy"]]
    for a, b in zip(results["vec"], results["numpy"]):
        assert a["similarity"] == pytest.approx(b["similarity"], abs=1e-6)
    assert results["vec"][0]["id"] == 6


def test_numpy_index_sees_memories_added_later(tmp_path: Path) -> None:
    path = str(tmp_path / "b.db")
    vectors = vector_bank(path, n=50, dim=8)
    params = RetrieveParams(k1=3, k2=1, threshold=-1.0)
    with MemoryBank(path, index="numpy") as reader, MemoryBank(path) as writer:
        assert reader.retrieve("q", params, vector=vectors[7].tolist(), record=False).memories[0]["id"] == 8
        target = [0.0] * 7 + [1.0]
        new = writer.ingest("late", "x", vector=target).id
        assert reader.retrieve("q", params, vector=target, record=False).memories[0]["id"] == new == 51


# -- rewards --------------------------------------------------------------------------------------


def test_reward_rule_ledger_and_repeat_refusal(bank_at: Callable[[str], str]) -> None:
    vector_bank(bank_at("b"), n=5, dim=8)
    with MemoryBank(bank_at("b")) as bank:
        hit = bank.retrieve("q", RetrieveParams(k1=5, k2=2, threshold=-1.0), vector=[1.0] * 8)
        chosen = [m["id"] for m in hit.memories]
        updates = bank.reward(1.0, retrieval_id=hit.id, alpha=0.5)
        assert updates == [{"id": i, "q_before": 0.0, "q_after": 0.5} for i in chosen]
        with pytest.raises(MemrlError, match="already rewarded; pass allow_repeat"):
            bank.reward(1.0, retrieval_id=hit.id)
        again = bank.reward(-1.0, retrieval_id=hit.id, allow_repeat=True, alpha=0.5)
        assert [u["q_after"] for u in again] == [-0.25, -0.25]
        bank.reward(-1.0, memory_ids=[chosen[0]], floor=-0.3)
        row = memory_view(bank, chosen[0])
        assert row["visits"] == 3 and row["q"] == -0.3
        assert [r["retrieval_id"] for r in row["ledger"]] == [hit.id, hit.id, None]
        assert replay(0.0, row["ledger"]) == row["q"]


@pytest.mark.parametrize("kwargs, message", [
    ({"reward": float("nan"), "memory_ids": [1]}, "finite"),
    ({"reward": float("inf"), "memory_ids": [1]}, "finite"),
    ({"reward": "lots", "memory_ids": [1]}, "must be a finite number"),
    ({"reward": 1.0, "memory_ids": [1], "alpha": 0.0}, r"alpha must be in \(0, 1\]"),
    ({"reward": 1.0, "memory_ids": [1, 999]}, "unknown memory id 999"),
    ({"reward": 1.0, "retrieval_id": 42}, "unknown retrieval id 42"),
    ({"reward": 1.0}, "give one of a retrieval id, memory ids or a task id"),
])
def test_bad_rewards_leave_the_bank_unchanged(bank_at: Callable[[str], str], kwargs: dict, message: str) -> None:
    vector_bank(bank_at("b"), n=3, dim=4)
    with MemoryBank(bank_at("b")) as bank:
        with pytest.raises(MemrlError, match=message):
            bank.reward(**kwargs)
        assert bank.conn.execute("SELECT count(*), sum(visits), sum(q) FROM memories").fetchone() == (3, 0, 0.0)
        assert bank.conn.execute("SELECT count(*) FROM rewards").fetchone()[0] == 0


def test_reward_many_is_one_transaction(bank_at: Callable[[str], str]) -> None:
    vector_bank(bank_at("b"), n=3, dim=4)
    with MemoryBank(bank_at("b")) as bank:
        with pytest.raises(MemrlError, match="reward 2: "):
            bank.reward_many([{"reward": 1.0, "memory_ids": [1]}, {"reward": None, "memory_ids": [2]}])
        assert bank.conn.execute("SELECT count(*) FROM rewards").fetchone()[0] == 0
        done = bank.reward_many([{"reward": 1.0, "memory_ids": [1]}, {"reward": 1.0, "memory_ids": [1], "alpha": 1}])
        assert [u["q_after"] for u in done] == [0.3, 1.0]


def test_a_caught_inner_failure_rolls_back_only_the_inner_block(bank_at: Callable[[str], str]) -> None:
    """Nested transactions are savepoints: an inner block that fails after writing leaves nothing
    behind when its caller catches the error, and the outer transaction goes on and commits (also
    after a statement the server refused, which aborts a PostgreSQL transaction without one)."""
    vector_bank(bank_at("b"), n=3, dim=4)
    with MemoryBank(bank_at("b")) as bank:
        with bank.transaction():
            bank.reward(1.0, memory_ids=[1])
            with pytest.raises(MemrlError, match="unknown memory id 99"), bank.transaction():
                bank.ingest("inner", "rolled back", vector=[1.0, 0.0, 0.0, 0.0])
                bank.reward(1.0, memory_ids=[2, 99])  # memory 2 is updated before 99 is found missing
            with pytest.raises(MemrlError, match="no_such_column"), bank.transaction():
                bank.reward(1.0, memory_ids=[2])
                bank.conn.execute("SELECT no_such_column FROM memories")
            with bank.transaction():  # a nested block that succeeds commits with the outer one
                with bank.transaction():
                    bank.ingest("kept", "inner and committed", vector=[0.0, 1.0, 0.0, 0.0])
            bank.reward(-1.0, memory_ids=[3])
        assert bank.conn.execute("SELECT id, visits FROM memories ORDER BY id").fetchall()[:3] == [(1, 1), (2, 0), (3, 1)]
        assert [r[0] for r in bank.conn.execute("SELECT intent FROM memories WHERE id > 3")] == ["kept"]
        assert [r[0] for r in bank.conn.execute("SELECT memory_id FROM rewards ORDER BY id")] == [1, 3]
        assert verify(bank)["ok"]
        with pytest.raises(RuntimeError), bank.transaction():  # an outer failure still undoes its inner blocks
            with bank.transaction():
                bank.reward(1.0, memory_ids=[2])
            raise RuntimeError("abort")
        assert bank.conn.execute("SELECT count(*) FROM rewards").fetchone()[0] == 2


WORKER = """
import sys
from memrl_cli.bank import MemoryBank
path, worker = sys.argv[1], int(sys.argv[2])
bank = MemoryBank(path)
for i in range(50):
    bank.reward((worker + 1) * (-1) ** i / 4, memory_ids=[1], alpha=0.1 + 0.1 * worker, source=f"w{worker}")
"""


def test_four_processes_rewarding_one_memory_lose_no_update(bank_at: Callable[[str], str]) -> None:
    path = bank_at("b")
    vector_bank(path, n=3, dim=4)
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, path, str(w)], stderr=subprocess.PIPE, text=True)
               for w in range(4)]
    errors = [w.communicate(timeout=120)[1] for w in workers]
    assert [w.returncode for w in workers] == [0] * 4, errors
    assert not any("locked" in e for e in errors)
    with MemoryBank(path) as bank:
        row = memory_view(bank, 1)
        assert row["visits"] == 200 and len(row["ledger"]) == 200
        assert sorted({r["source"] for r in row["ledger"]}) == ["w0", "w1", "w2", "w3"]
        assert replay(row["q_init"], row["ledger"]) == row["q"]
        q = 0.0
        for r in row["ledger"]:  # every update started from the previous one's result
            assert r["q_before"] == q
            q = q_update(q, r["reward"], r["alpha"])
        assert verify(bank)["ok"]


def test_set_q_is_in_the_ledger(bank_at: Callable[[str], str]) -> None:
    vector_bank(bank_at("b"), n=2, dim=4)
    with MemoryBank(bank_at("b")) as bank:
        bank.reward(1.0, memory_ids=[1])
        bank.set_q(1, -0.5, "reset")
        bank.reward(1.0, memory_ids=[1], alpha=0.5)
        assert memory_view(bank, 1)["q"] == 0.25 and verify(bank)["ok"]
        bank.conn.execute("UPDATE memories SET q = 0.9 WHERE id = 1")  # tampering is caught
        report = verify(bank)
        assert not report["ok"] and "differs from the replay" in report["problems"][0]


# -- calibration of z(sim) -------------------------------------------------------------------------


def test_calibration_is_computed_and_refreshed_as_the_bank_grows(bank_at: Callable[[str], str]) -> None:
    path = bank_at("b")
    vectors = vector_bank(path, n=20, dim=8)
    with MemoryBank(path) as bank:
        stats = bank.meta("sim_stats")
        sims = (vectors @ vectors.T)[np.triu_indices(20, k=1)]
        assert stats["memories"] == 20 and stats["pairs"] == 190
        assert stats["mean"] == pytest.approx(sims.mean(), abs=1e-6)
        assert stats["std"] == pytest.approx(sims.std(), abs=1e-6)
        assert bank.similarity_stats() == (stats["mean"], stats["std"])
        extra = unit(np.random.default_rng(1), 3, 8)
        bank.ingest("x1", "y", vector=extra[0].tolist())
        assert bank.meta("sim_stats")["memories"] == 20  # +5%: kept
        bank.ingest("x2", "y", vector=extra[1].tolist())
        assert bank.meta("sim_stats")["memories"] == 22  # +10%: refreshed
        bank.ingest("x3", "y", vector=extra[2].tolist())
        assert bank.meta("sim_stats")["memories"] == 22

        fixed = bank.calibrate(mean=0.1, std=0.05)
        assert fixed["used"] == {"mean": 0.1, "std": 0.05} and bank.similarity_stats() == (0.1, 0.05)
        hit = bank.retrieve("q", RetrieveParams(k1=3, k2=3, threshold=-1.0, sim_stats="bank"), vector=vectors[0].tolist())
        c = hit.candidates[0]
        assert c.z_sim == pytest.approx((c.similarity - 0.1) / 0.05)  # the bank's fixed statistics, under the switch
        paper = bank.retrieve("q", RetrieveParams(k1=3, k2=3, threshold=-1.0), vector=vectors[0].tolist())
        sims = np.array([c.similarity for c in paper.candidates])
        assert [c.z_sim for c in paper.candidates] == pytest.approx(list((sims - sims.mean()) / sims.std()))

        per_call = bank.retrieve("q", RetrieveParams(k1=3, k2=3, threshold=-1.0, sim_mean=0.0, sim_std=0.5),
                                 vector=vectors[0].tolist())
        assert per_call.candidates[0].z_sim == pytest.approx(per_call.candidates[0].similarity / 0.5)
        receipt = bank.conn.execute("SELECT sim_mean, sim_std FROM retrievals WHERE id = ?", (per_call.id,)).fetchone()
        assert receipt == (0.0, 0.5)

        cleared = bank.calibrate(clear=True)
        assert cleared["override"] is None and cleared["stats"]["memories"] == 23
        assert bank.similarity_stats() == (cleared["stats"]["mean"], cleared["stats"]["std"])
        with pytest.raises(MemrlError, match="give both --mean and --std"):
            bank.calibrate(mean=0.2)


# -- the numpy fallback and the stale index -------------------------------------------------------


def test_numpy_fallback_then_index_rebuild(sqlite_text_bank: str, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    params = RetrieveParams(k1=5, k2=3, threshold=0.0)
    with MemoryBank(sqlite_text_bank) as bank:
        assert bank.vec.loaded and bank.store.index_info()["kind"] == "none"  # the sqlite-vec index is opt-in
        assert bank.set_index("vec") == {"kind": "vec", "sqlite_vec": True, "reason": None, "state": "ok",
                                         "indexed": 10}
        with_vec = bank.retrieve(QUERY, params, record=False).memories
    monkeypatch.setenv("MEMRL_DISABLE_VEC", "1")
    with MemoryBank(sqlite_text_bank) as bank:
        assert not bank.vec.loaded
        fallback = bank.retrieve(QUERY, params, record=False).memories
        assert "unusable, retrieving by numpy scan: disabled by MEMRL_DISABLE_VEC=1" in capsys.readouterr().err
        with pytest.raises(MemrlError, match="index=vec needs sqlite-vec"):
            MemoryBank(sqlite_text_bank, index="vec")
        added = bank.ingest("heat the apple in a microwave", "new while the index was off")
        assert bank.meta("index")["state"] == "stale"
    assert [m["id"] for m in fallback] == [m["id"] for m in with_vec]
    for a, b in zip(fallback, with_vec):
        assert a["similarity"] == pytest.approx(b["similarity"], abs=1e-6)
        assert a["score"] == pytest.approx(b["score"], abs=1e-4)
    monkeypatch.delenv("MEMRL_DISABLE_VEC")
    with MemoryBank(sqlite_text_bank) as bank:
        assert bank.meta("index")["state"] == "ok"
        assert bank.conn.execute("SELECT count(*) FROM memory_index").fetchone()[0] == 11
        assert verify(bank)["ok"]
        ids = [m["id"] for m in bank.retrieve(QUERY, params, record=False).memories]
        assert added.id in ids


# -- opening files --------------------------------------------------------------------------------


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "b.db")
    vector_bank(path, n=2, dim=4)
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {schema.LATEST + 1}")
    with pytest.raises(MemrlError, match=f"schema version {schema.LATEST + 1}, newer than this memrl"):
        MemoryBank(path)


def test_trigger_is_refused_view_and_table_are_ignored(tmp_path: Path) -> None:
    path = str(tmp_path / "b.db")
    vector_bank(path, n=2, dim=4)
    conn = sqlite3.connect(path)
    conn.execute("CREATE VIEW good AS SELECT id, q FROM memories WHERE q > 0")
    conn.execute("CREATE TABLE notes (x)")
    conn.commit()
    with MemoryBank(path) as bank:
        assert bank.warnings == ["ignoring view 'good', which memrl did not create",
                                 "ignoring table 'notes', which memrl did not create"]
        assert bank.count() == 2
    conn.execute("CREATE TRIGGER sneaky AFTER UPDATE ON memories BEGIN DELETE FROM memories; END")
    conn.commit()
    conn.close()
    with pytest.raises(MemrlError, match=r"refusing to open a bank with triggers memrl did not create \(sneaky\)"):
        MemoryBank(path)


def test_migrations_bring_an_old_bank_up_to_date(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in schema.MIGRATIONS[0].ddl("sqlite"):
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    conn.close()
    with MemoryBank(path) as bank:
        assert bank.conn.execute("PRAGMA user_version").fetchone()[0] == schema.LATEST
        tables = {r[0] for r in bank.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert not {"runs", "episodes", "run_batches"} & tables  # the harness's tables: its own set (schema.RUNS)
        runs.create_run(bank, "r1", "toy", "memrl", {}, {}, 0, "test")
        tables = {r[0] for r in bank.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"runs", "episodes", "run_batches"} <= tables


def test_not_a_bank_and_missing_files(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(MemrlError, match="not a memrl bank: not a SQLite database"):
        MemoryBank(junk)
    with pytest.raises(MemrlError, match="no bank at"):
        MemoryBank(tmp_path / "absent.db", create=False)
    with pytest.raises(MemrlError, match="does not exist"):
        MemoryBank(tmp_path / "no" / "dir.db")
    with pytest.raises(MemrlError, match="is a directory"):
        MemoryBank(tmp_path)


def test_readonly_bank(bank_at: Callable[[str], str]) -> None:
    vector_bank(bank_at("b"), n=3, dim=4)
    with MemoryBank(bank_at("b"), readonly=True) as bank:
        assert bank.count() == 3
        with pytest.raises(MemrlError, match="opened read-only"):
            bank.reward(1.0, memory_ids=[1])


def test_metadata_json_round_trips(bank_at: Callable[[str], str]) -> None:
    with MemoryBank(bank_at("b"), "external:t:4") as bank:
        meta = {"nested": {"list": [1, 2.5, "ü"]}, "flag": True}
        mid = bank.ingest("a", "b", vector=[0, 0, 1, 0], metadata=meta).id
        stored = bank.conn.execute("SELECT metadata FROM memories WHERE id = ?", (mid,)).fetchone()[0]
        assert json.loads(stored) == meta == memory_view(bank, mid)["metadata"]


def test_an_engine_index_asked_for_on_a_new_bank_covers_every_memory(bank_at: Callable[[str], str]) -> None:
    location = bank_at("b")
    kind = "hnsw" if location.startswith("postgresql://") else "vec"
    vectors = unit(np.random.default_rng(3), 10, 8)
    with MemoryBank(location, "external:test:8", index=kind) as bank:
        bank.ingest_many([{"intent": f"task {i}", "experience": f"did {i}", "vector": v.tolist()}
                          for i, v in enumerate(vectors)])
        info = bank.store.index_info()
        assert info["kind"] == kind and info.get("indexed", 10) == 10
        hit = bank.retrieve("q", RetrieveParams(k1=3, k2=1, threshold=-1.0), vector=vectors[4].tolist(), record=False)
        assert hit.memories[0]["intent"] == "task 4" and hit.memories[0]["similarity"] == pytest.approx(1.0, abs=1e-6)
        assert verify(bank)["ok"]
