"""Recall that stays right at ALFWorld's scale: a bank of the 3,553 training games' intents × 6 memories, embedded
with the default embedder. Many games share an intent and many intents look alike (a median of 43 other games at
cosine ≥ 0.9), so a recall that keeps the newest rather than the most similar loses a task's own memories."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import bench_data
from memrl_cli.bank import MemoryBank
from memrl_cli.method.retrieval import RetrieveParams

MEMORIES_PER_GAME = 6


@pytest.fixture(scope="module")
def alfworld_bank(tmp_path_factory: pytest.TempPathFactory):
    """Six memories per training game (their intents' default embeddings), stored epoch after epoch as a run would."""
    data = bench_data.alfworld()
    if data is None:
        bench_data.unavailable("alfworld")
    from memrl_bench.adapters.alfworld.data import list_games, resolve_data_dir

    games = list_games(resolve_data_dir(str(data)), "train")
    assert len(games) == 3553
    bank = MemoryBank(str(tmp_path_factory.mktemp("scale") / "bank.db"))
    intents = sorted({g.intent for g in games})
    vectors = dict(zip(intents, bank.embedder.embed(intents)))
    for epoch in range(MEMORIES_PER_GAME):
        bank.ingest_many([{"intent": g.intent, "experience": f"epoch {epoch} of {g.id}",
                           "vector": vectors[g.intent].tolist(), "task_id": g.id} for g in games])
    yield bank, intents, vectors, Counter(g.intent for g in games)
    bank.close()


def own_memories(bank: MemoryBank, intent: str, candidates: list[tuple[int, float]]) -> int:
    """How many of (id, similarity) `candidates` were stored under `intent` itself (or under an intent whose
    embedding is the same vector: similarity 1, which no recall can tell apart)."""
    ids = [i for i, _ in candidates]
    rows = dict(bank.conn.execute(f"SELECT id, intent FROM memories WHERE id IN ({','.join('?' * len(ids))})",
                                  ids).fetchall()) if ids else {}
    return sum(rows[i] == intent or sim >= 1 - 1e-6 for i, sim in candidates)


@pytest.mark.slow
@pytest.mark.timeout(2400)  # embedding 2,304 intents: about 2 min of CPU
@pytest.mark.parametrize("recall", ["memories", "groups"])
def test_every_query_recalls_its_own_memories(alfworld_bank, recall):
    """For every distinct intent, Phase B sees min(k1, its stored memories) of its own memories under the default
    recall (k1 memories), and under grouped recall (whose pool keeps the most similar) all of them up to the pool."""
    bank, intents, vectors, games_per_intent = alfworld_bank
    params = RetrieveParams(k1=5, recall=recall, member_similarity=recall == "groups")  # own similarities, to count
    short = []
    for intent in intents:
        got = bank.retrieve(intent, params, vector=vectors[intent].tolist(), record=False)
        ids = [(c.memory_id, c.similarity) for c in got.candidates]
        stored = games_per_intent[intent] * MEMORIES_PER_GAME
        expected = min(params.k1, stored) if recall == "memories" else min(params.pool, stored)
        if own_memories(bank, intent, ids) < expected:
            short.append(intent)
    assert not short, f"{len(short)} of {len(intents)} intents lost their own memories, e.g. {short[0]!r}"
    assert np.mean(list(games_per_intent.values())) > 1  # the bank really has shared intents
