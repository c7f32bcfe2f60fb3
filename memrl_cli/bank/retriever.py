"""Retrieval over a bank, and the receipt it leaves: both phases of `memrl_cli.method.retrieval` run on the
bank's memories, and every candidate with its scores is stored, so that a reward later resolves
to exactly the memories that were selected (and the `memrl-conditioned` selector can learn from
past rewarded retrievals).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from memrl_cli.bank.calibration import Calibration
from memrl_cli.bank.connection import BankConnection
from memrl_cli.errors import MemrlError
from memrl_cli.bank.search_index import SearchIndex
from memrl_cli.bank.records import check_scope, check_task_id, check_text, now
from memrl_cli.method.retrieval import (SAME_INTENT, Candidate, RetrieveParams, conditioned_utility, phase_b,
                                        transfer_record, zscore_stats)
from memrl_cli.bank.vectors import BankVectors


@dataclass
class Retrieval:
    """The answer to a retrieve: the selected memories (best first) and the receipt behind them."""

    id: int | None
    query: str
    memories: list[dict[str, Any]]
    candidates: list[Candidate]
    explored: bool
    params: RetrieveParams
    sim_stats: tuple[float, float] = (0.0, 1.0)  # the (mean, std) z(sim) used, as a receipt records them
    query_vector: np.ndarray | None = None  # stored with the receipt when there were candidates
    task_id: str | None = None  # the caller's id for the task it was retrieved for (the receipt keeps it)
    scope: str | None = None  # whom the task belongs to (`user:alice`; the receipt keeps it)

    def to_dict(self) -> dict[str, Any]:
        """The JSON contract of `memrl retrieve --json`."""
        return {"retrieval_id": self.id, "query": self.query, "memories": self.memories}


FIELDS = {f.name for f in fields(RetrieveParams)}  # a receipt's params that RetrieveParams takes back


def _selected(candidates: list[Candidate]) -> list[Candidate]:
    """The selected candidates, in selection order."""
    return sorted((c for c in candidates if c.selected_rank is not None), key=lambda c: c.selected_rank or 0)


class Retriever:
    """Two-phase retrieval with receipts over one bank."""

    def __init__(self, db: BankConnection, vectors: BankVectors, index: SearchIndex, calibration: Calibration) -> None:
        self.db = db
        self.vectors = vectors
        self.index = index
        self.calibration = calibration

    def retrieve(self, query: str, params: RetrieveParams | None, vector: list[float] | None,
                 record: bool, task_id: str | None = None, scope: str | None = None) -> Retrieval:
        """Both phases; with `record`, the receipt is stored and its id returned for `reward`. The receipt
        keeps `task_id` and `scope` (what the caller calls the task, whom it belongs to), to reward it by task."""
        task_id, scope = check_task_id(task_id), check_scope(scope)
        with self.db.one_version():
            return self._retrieve(query, params, vector, record, task_id, scope)

    def _retrieve(self, query: str, params: RetrieveParams | None, vector: list[float] | None,
                  record: bool, task_id: str | None, scope: str | None) -> Retrieval:
        params = params or RetrieveParams()
        query = check_text(query, "query", "")
        candidates: list[Candidate] = []
        explored = False
        sim_stats = self.sim_stats(params)  # fixed statistics, or None: the candidates' own
        rows: dict[int, tuple] = {}
        cache: tuple[str, np.ndarray] | None = None
        if self.db.has_memories():
            if vector is None:  # a repeated query text skips the embedding model (the receipt's write fills the cache)
                query_vec, key = self.vectors.embed_query(query)
                cache = (key, query_vec) if key else None
            else:
                query_vec = self.vectors.query_vector(query, vector)
            id_list, sim_list = self.index.recall(query_vec, params)
            if id_list:  # Q and text of every candidate in one read: the selected ones are among them
                rows = {r[0]: r for r in self.db.by_ids("id, q, intent, experience, outcome", "memories",
                                                        id_list)}
                candidates = [Candidate(i, s, float(rows[i][1])) for i, s in zip(id_list, sim_list)]
                if params.selector == "memrl-conditioned":
                    self.condition(candidates, query_vec)
                if sim_stats is None:  # the receipt records the statistics actually used
                    sim_stats = zscore_stats(np.array(sim_list, dtype=np.float64))
                explored = phase_b(candidates, params, sim_stats, random.Random(params.seed))
        selected = _selected(candidates)
        memories = [{"id": c.memory_id, "intent": rows[c.memory_id][2], "experience": rows[c.memory_id][3],
                     "outcome": rows[c.memory_id][4], "similarity": c.similarity, "q": c.q, "score": c.score}
                    for c in selected]
        retrieval = Retrieval(None, query, memories, candidates, explored, params, sim_stats or (0.0, 1.0),
                              query_vec if candidates else None, task_id, scope)
        if record:
            retrieval.id = self.write_receipt(retrieval, cache)
        return retrieval

    def sim_stats(self, params: RetrieveParams) -> tuple[float, float] | None:
        """z(sim)'s fixed (mean, std): the call's constants, else with the `sim_stats="bank"` switch the bank's
        (those fixed by `memrl calibrate --mean --std`, else measured); None to standardise over the candidates."""
        if params.sim_mean is not None and params.sim_std is not None:
            return params.sim_mean, params.sim_std
        return self.calibration.similarity_stats() if params.sim_stats == "bank" else None

    def record(self, retrieval: Retrieval) -> int:
        """Store the receipt of a retrieval made with `record=False`, exactly as `retrieve` would have;
        set and return its id."""
        if retrieval.id is not None:
            raise MemrlError(f"retrieval {retrieval.id} is already recorded")
        retrieval.id = self.write_receipt(retrieval)
        return retrieval.id

    def recorded(self, retrieval_id: int) -> Retrieval:
        """A stored receipt read back: its query, task and parameters, and the memories it selected (best first)
        with their texts as they are now (a memory forgotten since is left out)."""
        receipt = self.db.store.receipt(retrieval_id)
        if receipt is None:
            raise MemrlError(f"unknown retrieval id {retrieval_id}")
        memories = [{"id": mid, "intent": intent, "experience": experience, "outcome": outcome, "similarity": sim,
                     "q": q, "score": score} for mid, intent, experience, outcome, sim, q, score, forgotten
                    in self.db.store.selected_memories(retrieval_id) if forgotten is None]
        params = RetrieveParams(**{k: v for k, v in json.loads(receipt["params"]).items() if k in FIELDS})
        return Retrieval(retrieval_id, receipt["query"], memories, [], bool(receipt["explored"]), params,
                         (receipt["sim_mean"], receipt["sim_std"]), None, receipt["task_id"], receipt["scope"])

    def condition(self, candidates: list[Candidate], query_vec: np.ndarray) -> None:
        """`memrl-conditioned`: set each candidate's query-conditioned utility from its rewarded past
        retrievals (receipts + ledger) and its transfer record (those queries' cosines to its own intent)."""
        past: dict[int, list[tuple[float, float]]] = {c.memory_id: [] for c in candidates}
        elsewhere: dict[int, list[tuple[float, float]]] = {c.memory_id: [] for c in candidates}
        ids = sorted(past)
        intents = dict(zip(ids, self.index.stored_vectors(np.array(ids, dtype=np.int64))))
        for mid, reward, blob in self.db.store.rewarded_queries(ids):
            past_query = np.frombuffer(bytes(blob), dtype=np.float32)
            past[mid].append((float(past_query @ query_vec), float(reward)))
            elsewhere[mid].append((float(past_query @ intents[mid]), float(reward)))
        for c in candidates:
            c.transfer = transfer_record(elsewhere[c.memory_id])
            elsewhere_here = float(intents[c.memory_id] @ query_vec) < SAME_INTENT
            c.utility = conditioned_utility(past[c.memory_id], c.transfer if elsewhere_here else 0.0) \
                if past[c.memory_id] else None

    def write_receipt(self, retrieval: Retrieval, cache: tuple[str, np.ndarray] | None = None) -> int:
        """Store a retrieval's receipt (its candidates with their scores; the selected ones' last use; its task id
        and scope), and the query's vector in the query cache when `cache` gives its key; the receipt's id."""
        candidates, selected, query_vec = retrieval.candidates, _selected(retrieval.candidates), retrieval.query_vector
        stamp = now()
        with self.db.transaction():
            # The candidates' foreign keys lock their memories (and the selected ones' last_used_at
            # changes them): lock them all first, in id order as rewards do, so the two never deadlock.
            self.db.lock("memories", {c.memory_id for c in candidates})
            if cache is not None:
                self.vectors.cache_query(cache[0], cache[1], stamp)
            store = self.db.store
            rid = store.insert_receipt(retrieval.query, json.dumps(retrieval.params.to_dict()), retrieval.sim_stats[0],
                                       retrieval.sim_stats[1], retrieval.explored, stamp,
                                       None if query_vec is None else query_vec.astype(np.float32).tobytes(),
                                       retrieval.task_id, retrieval.scope)
            store.insert_candidates([(rid, c.memory_id, rank, c.similarity, c.q, c.z_sim, c.z_q, c.score, c.selected_rank)
                                     for rank, c in enumerate(candidates)])
            store.mark_used(sorted(c.memory_id for c in selected), stamp)
        return rid
