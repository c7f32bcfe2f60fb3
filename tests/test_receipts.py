"""memrl_cli.bank.retriever alone, on both engines: retrieval leaves exactly one receipt (or none until
recorded), and the query-conditioned utility reads past rewarded receipts."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from bank_parts import connect, seed, unit

from memrl_cli.bank.calibration import Calibration
from memrl_cli.errors import MemrlError
from memrl_cli.bank.search_index import SearchIndex
from memrl_cli.bank.retriever import Retrieval, Retriever
from memrl_cli.method.retrieval import Candidate, RetrieveParams
from memrl_cli.bank.vectors import BankVectors


def retriever_at(location: str) -> Retriever:
    db = connect(location)
    return Retriever(db, BankVectors(db, "external:test:8"), SearchIndex(db, "auto", []), Calibration(db))


def test_an_unrecorded_retrieval_writes_nothing_until_recorded(bank_at: Callable[[str], str]) -> None:
    retriever = retriever_at(bank_at("b"))
    empty = retriever.retrieve("q", None, unit(1, dim=8)[0].tolist(), True)
    assert empty.memories == [] and empty.id == 1  # an empty bank still leaves its receipt
    vectors = unit(20, dim=8)
    seed(retriever.db, vectors)
    params = RetrieveParams(k1=4, k2=2, threshold=-1.0, recall="memories")
    hit = retriever.retrieve("q", params, vectors[2].tolist(), False)
    assert hit.id is None and [m["id"] for m in hit.memories][0] == 3 and len(hit.memories) == 2
    count = "SELECT count(*) FROM retrievals"
    assert retriever.db.conn.execute(count).fetchone()[0] == 1
    assert retriever.record(hit) == 2 and hit.id == 2
    with pytest.raises(MemrlError, match="retrieval 2 is already recorded"):
        retriever.record(hit)
    rows = retriever.db.conn.execute("SELECT memory_id, selected_rank FROM retrieval_candidates WHERE retrieval_id = 2 "
                                     "ORDER BY recall_rank").fetchall()
    assert [r[0] for r in rows] == [c.memory_id for c in hit.candidates] and len(rows) == 4
    assert sorted((r[1], r[0]) for r in rows if r[1] is not None) == [(0, 3), (1, hit.memories[1]["id"])]
    used = retriever.db.conn.execute("SELECT count(*) FROM memories WHERE last_used_at IS NOT NULL").fetchone()[0]
    assert used == 2
    with pytest.raises(MemrlError, match="query must be a non-empty string"):
        retriever.retrieve(" ", params, vectors[2].tolist(), False)


def test_conditioning_weighs_past_rewards_by_query_similarity(bank_at: Callable[[str], str]) -> None:
    retriever = retriever_at(bank_at("b"))
    vectors = unit(3, dim=8)
    seed(retriever.db, vectors)
    near = Candidate(1, 1.0, 0.0)
    retriever.condition([near], vectors[0])
    assert near.utility is None  # never rewarded
    rid = retriever.write_receipt(Retrieval(None, "q", [], [Candidate(1, 1.0, 0.0, selected_rank=0)], False,
                                            RetrieveParams(), query_vector=vectors[0]))
    with retriever.db.transaction() as conn:
        conn.execute("INSERT INTO rewards (retrieval_id, memory_id, kind, reward, alpha, q_before, q_after, created_at) "
                     "VALUES (?, 1, 'reward', 1.0, 0.3, 0.0, 0.3, 'now')", (rid,))
    same, far = Candidate(1, 1.0, 0.0), Candidate(2, 0.5, 0.0)
    retriever.condition([same, far], vectors[0])
    assert same.utility is not None and same.utility > 0 and far.utility is None
    other = Candidate(1, 1.0, 0.0)
    retriever.condition([other], -vectors[0])  # a dissimilar query: the past reward barely counts
    assert other.utility is not None and 0 <= other.utility < same.utility
    assert np.isfinite(same.utility)
