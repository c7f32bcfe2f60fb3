"""Phase A and Phase B of retrieval (memrl_cli.method.retrieval), as pure functions on arrays."""

from __future__ import annotations

import random

import numpy as np
import pytest

from memrl_cli.errors import MemrlError
from memrl_cli.method.retrieval import (SIM_RESOLUTION, Z_CLIP, Candidate, RetrieveParams, phase_a, phase_b,
                                        similarity_stats, tie_levels, zscores)

STATS = (0.2, 0.1)  # a bank's (mean, std) of intent-intent cosine


def candidates(sims: list[float], qs: list[float]) -> list[Candidate]:
    """Candidates with ids 1..n, in the given (recall) order."""
    return [Candidate(i + 1, s, q) for i, (s, q) in enumerate(zip(sims, qs))]


def selected_ids(cands: list[Candidate]) -> list[int]:
    """Selected memory ids, best first."""
    chosen = sorted((c for c in cands if c.selected_rank is not None), key=lambda c: c.selected_rank or 0)
    return [c.memory_id for c in chosen]


def run_b(sims: list[float], qs: list[float], seed: int | None = 0, stats: tuple[float, float] = STATS,
          **params: object) -> tuple[list[Candidate], bool]:
    cands = candidates(sims, qs)
    explored = phase_b(cands, RetrieveParams(**params), stats, random.Random(seed))  # type: ignore[arg-type]
    return cands, explored


# -- z-scores -----------------------------------------------------------------------------


def test_zscores_use_population_std_and_given_statistics() -> None:
    values = np.array([1.0, 2.0, 3.0, 6.0])
    z = zscores(values)
    assert np.allclose(z, (values - 3.0) / np.sqrt(((values - 3.0) ** 2).mean()))
    assert np.allclose(zscores(values, mean=1.0, std=2.0), (values - 1.0) / 2.0)


def test_zscores_degenerate_std_is_one() -> None:
    assert np.array_equal(zscores(np.array([0.4])), [0.0])
    assert np.allclose(zscores(np.array([0.7, 0.7, 0.7])), 0.0, atol=1e-12)
    assert np.allclose(zscores(np.array([0.5, 0.7]), mean=0.5, std=0.0), [0.0, 0.2])


def test_zscores_clip() -> None:
    values = np.array([0.0] * 20 + [100.0])
    assert zscores(values).max() > Z_CLIP
    clipped = zscores(values, clip=Z_CLIP)
    assert clipped.max() == Z_CLIP and clipped.min() >= -Z_CLIP


# -- Phase B --------------------------------------------------------------------------------


def test_phase_b_score_is_the_documented_formula() -> None:
    sims, qs = [0.9, 0.7, 0.6, 0.4], [-0.5, 0.8, 0.1, 0.3]
    cands, explored = run_b(sims, qs, k2=4, lam=0.3)
    assert not explored
    z_sim = (np.array(sims) - STATS[0]) / STATS[1]
    q = np.array(qs)
    z_q = np.clip((q - q.mean()) / q.std(), -Z_CLIP, Z_CLIP)
    for c, zs, zq in zip(cands, z_sim, z_q):
        assert c.z_sim == pytest.approx(zs) and c.z_q == pytest.approx(zq)
        assert c.score == pytest.approx(0.7 * zs + 0.3 * zq)
    assert selected_ids(cands) == [c.memory_id for c in sorted(cands, key=lambda c: -c.score)]


def test_one_candidate_is_selected_with_zero_z_q() -> None:
    cands, _ = run_b([0.55], [0.9], k2=3)
    assert selected_ids(cands) == [1]
    assert cands[0].z_q == 0.0
    assert cands[0].score == pytest.approx(0.5 * (0.55 - 0.2) / 0.1)


def test_equal_q_falls_back_to_similarity_order() -> None:
    sims = [0.61, 0.93, 0.72, 0.80]
    cands, _ = run_b(sims, [0.4] * 4, k2=4, lam=0.9)
    assert all(c.z_q == pytest.approx(0.0, abs=1e-12) for c in cands)
    assert selected_ids(cands) == [2, 4, 3, 1]


def test_lambda_zero_is_pure_similarity_ranking() -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        sims = rng.uniform(0.3, 1.0, size=8).tolist()
        qs = rng.uniform(-1, 1, size=8).tolist()
        cands, _ = run_b(sims, qs, k2=3, lam=0.0)
        assert selected_ids(cands) == [int(i) + 1 for i in np.argsort(-np.array(sims))[:3]]


def test_lambda_one_ranks_by_q_only() -> None:
    sims, qs = [0.95, 0.90, 0.55, 0.52], [-0.9, 0.1, 0.7, 0.3]
    cands, _ = run_b(sims, qs, k2=2, lam=1.0)
    assert selected_ids(cands) == [3, 4]
    assert all(c.score == pytest.approx(c.z_q) for c in cands)


def test_value_beats_similarity_at_half_lambda() -> None:
    sims, qs = [0.85, 0.75], [-0.6, 0.9]
    assert selected_ids(run_b(sims, qs, k2=1, lam=0.0)[0]) == [1]
    assert selected_ids(run_b(sims, qs, k2=1, lam=0.5)[0]) == [2]


def test_per_call_similarity_statistics_override_the_bank() -> None:
    cands, _ = run_b([0.6, 0.5], [0.0, 0.0], k2=2, sim_mean=0.5, sim_std=0.05)
    assert [c.z_sim for c in cands] == pytest.approx([2.0, 0.0])


def test_epsilon_zero_never_explores() -> None:
    for seed in range(50):
        cands, explored = run_b([0.9, 0.8, 0.7, 0.6], [0, 0, 0, 0], seed=seed, k2=2)
        assert not explored and selected_ids(cands) == [1, 2]


def test_epsilon_greedy_is_seeded_and_reproducible() -> None:
    sims, qs = [0.9, 0.85, 0.8, 0.75, 0.7, 0.65], [0.1, 0.2, 0.3, -0.1, -0.2, 0.0]
    runs = [[run_b(sims, qs, seed=seed, k2=2, epsilon=0.5) for seed in range(40)] for _ in range(2)]
    picks = [[(selected_ids(c), e) for c, e in run] for run in runs]
    assert picks[0] == picks[1]
    explored = [e for _, e in picks[0]]
    assert 5 < sum(explored) < 35
    greedy = selected_ids(run_b(sims, qs, k2=2)[0])
    assert all(ids == greedy for ids, e in picks[0] if not e)
    assert any(ids != greedy for ids, e in picks[0] if e)
    always, _ = run_b(sims, qs, seed=3, k2=3, epsilon=1.0)
    assert len(selected_ids(always)) == 3


def test_empty_candidates() -> None:
    assert phase_b([], RetrieveParams(), STATS, random.Random(0)) is False


# -- Phase A ---------------------------------------------------------------------------------


def test_phase_a_top_k1_best_first() -> None:
    sims = np.array([0.1, 0.9, 0.5, 0.7, 0.3])
    ids = np.array([10, 11, 12, 13, 14])
    got_ids, got_sims = phase_a(sims, ids, k1=3, threshold=-1.0)
    assert got_ids.tolist() == [11, 13, 12] and got_sims.tolist() == [0.9, 0.7, 0.5]


def test_phase_a_threshold_filters_inclusively() -> None:
    sims = np.array([0.49, 0.5, 0.8, -0.2])
    ids = np.array([1, 2, 3, 4])
    assert phase_a(sims, ids, 10, 0.5)[0].tolist() == [3, 2]
    assert phase_a(sims, ids, 10, -1.0)[0].tolist() == [3, 2, 1, 4]
    assert phase_a(sims, ids, 10, 0.81)[0].tolist() == []


def test_phase_a_k1_larger_than_bank() -> None:
    got_ids, _ = phase_a(np.array([0.2, 0.6]), np.array([5, 6]), k1=100, threshold=0.0)
    assert got_ids.tolist() == [6, 5]


def test_phase_a_ties_go_to_the_newest_memory() -> None:
    assert phase_a(np.array([0.5, 0.5, 0.5]), np.array([9, 3, 6]), 2, 0.0)[0].tolist() == [9, 6]


# -- parameters and calibration ----------------------------------------------------------------


def test_similarities_within_the_resolution_are_one_similarity() -> None:
    """Float32 rounding of identical intents (1.0000002, 1.0000002, 1.0 by row) is no difference: every method
    orders them by id alone, and z(sim) over candidates that differ only by it is 0 (issue 41, item 1)."""
    rounded = np.array([1.0000001192092896, 1.0000001192092896, 1.0, 0.9999998807907104])
    assert np.all(tie_levels(rounded) == tie_levels(rounded)[0])
    assert tie_levels(np.array([0.5, 0.5 + 2 * SIM_RESOLUTION])).tolist() == [0.5, 0.5 + 2 * SIM_RESOLUTION]
    for order in ([0, 1, 2, 3], [2, 3, 0, 1], [3, 2, 1, 0]):  # the row a memory holds decides nothing
        ids = np.array([1, 2, 3, 4])[order]
        assert phase_a(rounded[order], ids, 1, 0.5)[0].tolist() == [4]
        assert phase_a(rounded[order], ids, 2, 0.5)[0].tolist() == [4, 3]
    near_threshold = np.array([0.5 - SIM_RESOLUTION / 4, 0.5 + SIM_RESOLUTION / 4])
    assert phase_a(near_threshold, np.array([1, 2]), 5, 0.5)[0].tolist() == [2, 1]  # both or neither: both
    for lam in (0.0, 0.5):
        cands, _ = run_b(rounded.tolist(), [0.0, 0.0, 0.0, 0.0], stats=None, k2=1, lam=lam)  # type: ignore[arg-type]
        assert [c.z_sim for c in cands] == [0.0] * 4 and selected_ids(cands) == [4]
    cands, _ = run_b([1.0000001192092896, 1.0, 0.6], [0.0, 0.0, 0.0], stats=None, k2=1, lam=0.0)  # type: ignore[arg-type]
    assert cands[0].z_sim == cands[1].z_sim and selected_ids(cands) == [2]


@pytest.mark.parametrize("kwargs", [{"k1": 0}, {"k2": 0}, {"k1": 5000}, {"lam": 1.5}, {"lam": -0.1},
                                    {"threshold": 1.01}, {"threshold": -1.5}, {"epsilon": 2.0},
                                    {"lam": float("nan")}, {"sim_mean": 0.1}, {"sim_mean": 0.1, "sim_std": 0.0}])
def test_bad_params_are_refused(kwargs: dict) -> None:
    with pytest.raises(MemrlError):
        RetrieveParams(**kwargs)


@pytest.mark.parametrize("threshold", [-1.0, -0.5, 0.0, 0.99, 1.0])
def test_any_threshold_in_range_is_accepted(threshold: float) -> None:
    assert RetrieveParams(threshold=threshold).threshold == threshold


def test_defaults_are_the_paper_defaults_with_no_exploration() -> None:
    p = RetrieveParams()
    assert (p.k1, p.k2, p.lam, p.threshold, p.epsilon) == (5, 3, 0.5, 0.5, 0.0)


def test_similarity_stats_all_pairs_and_sampled() -> None:
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(30, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    sims = (vectors @ vectors.T)[np.triu_indices(30, k=1)]
    mean, std, pairs = similarity_stats(vectors, rng)
    assert pairs == 435 and mean == pytest.approx(sims.mean(), abs=1e-6) and std == pytest.approx(sims.std(), abs=1e-6)
    mean_s, std_s, pairs_s = similarity_stats(vectors, rng, max_pairs=400)
    assert pairs_s == 400 and abs(mean_s - sims.mean()) < 0.05 and abs(std_s - sims.std()) < 0.05
    assert similarity_stats(vectors[:1], rng) == (0.0, 1.0, 0)


def test_a_reward_that_would_overflow_q_is_refused() -> None:
    from memrl_cli.errors import MemrlError
    from memrl_cli.method.learning import q_update

    assert q_update(1e308, 1e308, 1.0) == 1e308
    with pytest.raises(MemrlError, match="overflow"):
        q_update(1e308, -1e308, 0.9)
