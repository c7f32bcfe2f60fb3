"""Two-phase retrieval, as in MemRL (arXiv 2601.03192).

Phase A (similarity recall): memories whose intents are the same (cosine ≥ `group_threshold`,
0.9 as in the authors' code; identical vectors always) form one group; the k1 groups most
similar to the query are recalled, and every memory of a recalled group enters Phase B with its own
similarity (best first, newest first among ties), the pool capped at its `pool` newest. With
`recall="memories"`, k1 counts memories instead (ties broken by ascending id). Only
memories at or above `threshold` are recalled.
Phase B (value-aware selection): score each candidate by

    score = (1 − λ)·z(sim) + λ·z(Q)

and take the k2 best. λ = 0 is plain similarity RAG; λ = 1 ranks the recalled set by Q only.

z(Q) standardises Q over the candidate set (population std; std 1 when there is one
candidate or all Q are equal, so ties fall back to similarity) and is clipped to ±3.
z(sim) standardises similarity with the *bank's own* similarity statistics (mean and std of
cosine between stored intents, kept in the bank's meta and refreshed as it grows; see
`calibration`), or with an explicit override. The authors hard-coded per-benchmark
constants here, which is why users could not reproduce their numbers.

`selector` chooses the Phase-B utility term (`memrl` is the paper's rule above; see
`SELECTORS` and docs/method.md for the others):

* `calibrated`: z(Q) with the bank's own Q statistics, shrunk to a prior (symmetric with z(sim));
* `ucb`: `calibrated` plus an optimism bonus UCB_BONUS/√(1 + visits) for little-tried memories;
* `conditioned`: the utility of a memory *for this query*: rewards of its past retrievals weighted
  by how similar their query was to this one (kernel exp(−(1 − cos)/CONDITION_TAU)), shrunk to the
  memory's Q with CONDITION_PRIOR pseudo-observations, divided by Q_PRIOR_STD;
* `conditioned-z`: that query-conditioned utility standardised over the candidates, as the paper's
  z(Q) is; ties go to the newest memory;
* `conditioned-n`, `conditioned-nz`: `conditioned`, `conditioned-z` with a neutral prior: the
  pseudo-observation (and the utility of a memory never rewarded) is 0, a never-rewarded memory's
  Q, instead of the memory's own Q, so a Q earned at dissimilar queries does not count for this one;
* `conditioned-t`: `conditioned-n` where, for a query that is not the memory's own task (cosine
  < SAME_INTENT to its intent), the pseudo-observation is the memory's *transfer record* instead
  of 0: the mean reward of its uses for tasks other than its own, shrunk to 0 with CONDITION_PRIOR
  pseudo-observations. A memory that helped other tasks is worth trying for a new one, one that
  misled them is not; at its own task the prior stays 0 and that task's rewards decide;
* `conditioned-ts`: `conditioned-t` with the utility divided by WIDE_SCALE instead of Q_PRIOR_STD, so
  a utility of ±1 weighs ±3 in z units, the range of the paper's z(Q) (and of z(sim) at its clip).

With probability ε (seeded), Phase B picks a uniform random k2-subset of the candidates
instead (ε-greedy exploration); the receipt records that it did.

With `q_min`, Phase B selects only among candidates whose Q is at least `q_min`, as the authors'
code does (BCB and LLB: −0.8); z(Q)'s statistics still come from all candidates, before that
filter, also as in their code. A filtered-out candidate stays in the receipt, unselected.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from memrl_cli.errors import MemrlError
from memrl_cli.validators import is_finite, is_whole

Z_CLIP = 3.0
RECALLS = ("groups", "memories")
SELECTORS = ("memrl", "calibrated", "ucb", "conditioned", "conditioned-z", "conditioned-n", "conditioned-nz",
             "conditioned-t", "conditioned-ts")
CONDITIONED = ("conditioned", "conditioned-z", "conditioned-n", "conditioned-nz",
               "conditioned-t", "conditioned-ts")  # need the query-conditioned utility
TRANSFER = ("conditioned-t", "conditioned-ts")  # conditioned utilities with the transfer record as the prior elsewhere
OWN_Q_PRIOR = ("conditioned", "conditioned-z")  # conditioned utilities shrunk to the memory's own Q
STANDARDISED = ("conditioned-z", "conditioned-nz")  # conditioned utilities standardised over the candidates
SEARCH_WIDTH = 4  # grouped recall searches pool × this many memories, then groups them
Q_PRIOR_STD = 0.5  # prior std of Q (rewards ±1) for calibrated z(Q)
Q_PRIOR_COUNT = 10.0  # pseudo-memories behind that prior
UCB_BONUS = 1.0  # optimism, in z units, for a never-rewarded memory
CONDITION_TAU = 0.02  # query-similarity kernel width of `conditioned`
CONDITION_PRIOR = 1.0  # pseudo-observations of the memory's own Q behind `conditioned`
SAME_INTENT = 0.99  # `conditioned-t`: a query this close to a memory's intent is the memory's own task
WIDE_SCALE = 1.0 / Z_CLIP  # `conditioned-ts`: a utility of ±1 is ±Z_CLIP in z units, the paper's z(Q) range
FILTER_COLUMNS = ("source", "scope")  # the memory columns retrieval filters on, by shell-style patterns
# Retrieval's filters: (column, patterns) pairs; a memory passes when, for each pair with patterns, its
# column matches one of them (`Store.matches`).
Filters = tuple[tuple[str, tuple[str, ...]], ...]


def patterns(value: Any, name: str) -> tuple[str, ...]:
    """A tuple of non-empty pattern strings (one string is one pattern); a MemrlError otherwise."""
    found = (value,) if isinstance(value, str) else value or ()
    if not isinstance(found, (list, tuple)) or not all(isinstance(p, str) and p for p in found):
        raise MemrlError(f"{name} must be non-empty {name[:-1]} patterns, got {value!r}")
    return tuple(found)


@dataclass(frozen=True)
class RetrieveParams:
    """The knobs of both phases (paper defaults)."""

    k1: int = 5
    k2: int = 3
    lam: float = 0.5
    threshold: float = 0.5
    epsilon: float = 0.0
    seed: int | None = None
    sim_mean: float | None = None
    sim_std: float | None = None
    q_min: float | None = None
    recall: str = "groups"
    group_threshold: float = 0.9
    pool: int = 64
    selector: str = "memrl"
    sources: tuple[str, ...] = ()  # only memories from a source matching one of these patterns (`*`, `?`)
    scopes: tuple[str, ...] = ()  # only memories whose scope matches one of these patterns (`user:alice`, `team:*`)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", patterns(self.sources, "sources"))
        object.__setattr__(self, "scopes", patterns(self.scopes, "scopes"))
        if self.recall not in RECALLS:
            raise MemrlError(f"recall must be one of {', '.join(RECALLS)}, got {self.recall!r}")
        if self.selector not in SELECTORS:
            raise MemrlError(f"selector must be one of {', '.join(SELECTORS)}, got {self.selector!r}")
        if not (is_whole(self.pool) and 1 <= self.pool <= 1024):
            raise MemrlError(f"pool must be an integer in [1, 1024], got {self.pool!r}")
        if not (isinstance(self.k1, int) and isinstance(self.k2, int) and self.k1 >= 1 and self.k2 >= 1):
            raise MemrlError(f"k1 and k2 must be positive integers, got k1={self.k1}, k2={self.k2}")
        if self.k1 > 4096:
            raise MemrlError(f"k1 is at most 4096 (sqlite-vec's KNN limit), got {self.k1}")
        for name, value, low, high in (("lambda", self.lam, 0, 1), ("threshold", self.threshold, -1, 1),
                                       ("epsilon", self.epsilon, 0, 1),
                                       ("group threshold", self.group_threshold, -1, 1)):
            if not (is_finite(value) and low <= value <= high):
                raise MemrlError(f"{name} must be a number in [{low}, {high}], got {value!r}")
        if (self.sim_mean is None) != (self.sim_std is None):
            raise MemrlError("give both sim_mean and sim_std to override the similarity statistics, or neither")
        if self.sim_mean is not None and not (is_finite(self.sim_mean) and self.sim_std is not None
                                              and is_finite(self.sim_std) and self.sim_std > 0):
            raise MemrlError(f"sim_mean must be finite and sim_std finite and > 0, got {self.sim_mean}, {self.sim_std}")
        if self.q_min is not None and not is_finite(self.q_min):
            raise MemrlError(f"q_min must be a finite number or unset, got {self.q_min!r}")

    def to_dict(self) -> dict[str, Any]:
        """The parameters as stored in a receipt."""
        return asdict(self)

    @property
    def filters(self) -> Filters:
        """What Phase A filters on: the source and scope patterns."""
        return (("source", self.sources), ("scope", self.scopes))


@dataclass
class Candidate:
    """One Phase-A candidate with its Phase-B scores."""

    memory_id: int
    similarity: float
    q: float
    z_sim: float = 0.0
    z_q: float = 0.0
    score: float = 0.0
    selected_rank: int | None = None
    visits: int = 0
    utility: float | None = None  # `conditioned`: the query-conditioned utility
    transfer: float = 0.0  # `conditioned-t`, `conditioned-ts`: the memory's transfer record (`transfer_record`)
    extra: dict[str, Any] = field(default_factory=dict)


def zscores(values: np.ndarray, mean: float | None = None, std: float | None = None,
            clip: float | None = None) -> np.ndarray:
    """Standardise `values` by the given mean/std, else their own (population std, 1 if degenerate)."""
    mean = float(values.mean()) if mean is None else mean
    if std is None:
        std = float(values.std()) if len(values) > 1 else 1.0
    std = std if std > 1e-9 else 1.0
    z = (values - mean) / std
    return np.clip(z, -clip, clip) if clip is not None else z


def phase_a(similarities: np.ndarray, ids: np.ndarray, k1: int, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """Top-k1 (ids, float64 similarities) by similarity, best first, keeping sim ≥ threshold.

    One partition and one comparison over the whole array; the rest works on the few survivors.
    """
    n = len(similarities)
    cut = threshold
    if n > k1:  # keep everything tied with the k1-th best, so ties break by id below
        cut = max(cut, np.partition(similarities, n - k1)[n - k1])
    top = np.flatnonzero(similarities >= np.float64(cut))  # float64, as the similarities are reported
    sims, ids = similarities[top].astype(np.float64), ids[top]
    order = np.lexsort((ids, -sims))[:k1]
    return ids[order], sims[order]


def group_recall(ids: np.ndarray, sims: np.ndarray, vectors: np.ndarray, k1: int, group_threshold: float,
                 pool: int) -> tuple[list[int], list[float]]:
    """Grouped Phase A over searched candidates (best first): (ids, own similarities) of the pool.

    Candidates join the first group whose best member has cosine ≥ `group_threshold` with them
    (identical vectors always do); the first k1 groups are recalled, each member with its own
    similarity; the pool keeps its `pool` newest members (highest ids), best first.
    """
    order = np.lexsort((-ids, -sims))  # best first, newest first among ties
    ids, sims, vectors = ids[order], sims[order], vectors[order]
    first: dict[bytes, int] = {}
    same = np.array([first.setdefault(v.tobytes(), i) for i, v in enumerate(vectors)])  # identical vectors: one id
    joins: list[list[bool]] = []  # per group (its best member first seen): which rows join it
    members: list[tuple[int, int]] = []  # (group, row)
    for row in range(len(ids)):
        group = next((g for g, joined in enumerate(joins) if joined[row]), None)
        if group is None:
            if len(joins) == k1:
                continue
            joins.append((((vectors @ vectors[row]) >= group_threshold) | (same == same[row])).tolist())
            group = len(joins) - 1
        members.append((group, row))
    kept = sorted((row for _, row in members), key=lambda row: -int(ids[row]))[:pool]
    kept.sort()  # rows are already best first, newest first among ties
    return [int(ids[row]) for row in kept], [float(sims[row]) for row in kept]


def utility_z(candidates: list[Candidate], params: RetrieveParams, q_stats: tuple[float, float]) -> np.ndarray:
    """The Phase-B utility term of `params.selector`, in z units, clipped to ±Z_CLIP."""
    qs = np.array([c.q for c in candidates], dtype=np.float64)
    if params.selector == "memrl":
        return zscores(qs, clip=Z_CLIP)
    if params.selector in CONDITIONED:
        fallback = [c.q if params.selector in OWN_Q_PRIOR else 0.0 for c in candidates]  # never rewarded
        utility = np.array([f if c.utility is None else c.utility for c, f in zip(candidates, fallback)],
                           dtype=np.float64)
        if params.selector in STANDARDISED:
            return zscores(utility, clip=Z_CLIP)
        return zscores(utility, 0.0, WIDE_SCALE if params.selector == "conditioned-ts" else Q_PRIOR_STD, clip=Z_CLIP)
    z = zscores(qs, q_stats[0], q_stats[1])
    if params.selector == "ucb":
        z = z + UCB_BONUS / np.sqrt(1.0 + np.array([c.visits for c in candidates], dtype=np.float64))
    return np.clip(z, -Z_CLIP, Z_CLIP)


def shrunk_q_stats(count: int, mean: float, mean_square: float, q_init: float = 0.0) -> tuple[float, float]:
    """Bank-level (mean, std) of Q shrunk towards (q_init, Q_PRIOR_STD) with Q_PRIOR_COUNT pseudo-memories."""
    n = float(count)
    shrunk_mean = (n * mean + Q_PRIOR_COUNT * q_init) / (n + Q_PRIOR_COUNT)
    variance = max(mean_square - mean * mean, 0.0)
    shrunk_var = (n * variance + Q_PRIOR_COUNT * Q_PRIOR_STD ** 2) / (n + Q_PRIOR_COUNT)
    return shrunk_mean, math.sqrt(shrunk_var)


def conditioned_utility(q: float, rewards: list[tuple[float, float]], selector: str = "conditioned",
                        transfer: float = 0.0) -> float:
    """Utility for this query from (query cosine, reward) of a memory's past rewarded retrievals,
    shrunk with CONDITION_PRIOR pseudo-observations to the memory's Q, to 0 (`conditioned-n`, `conditioned-nz`)
    or to its `transfer` record (the `TRANSFER` selectors)."""
    weights = [math.exp(-(1.0 - cos) / CONDITION_TAU) for cos, _ in rewards]
    total = sum(w * r for w, (_, r) in zip(weights, rewards))
    prior = q if selector in OWN_Q_PRIOR else transfer if selector in TRANSFER else 0.0
    return (total + CONDITION_PRIOR * prior) / (sum(weights) + CONDITION_PRIOR)


def transfer_record(rewards: list[tuple[float, float]]) -> float:
    """A memory's help to tasks other than its own: the mean reward of its uses at queries whose
    cosine to its intent is below SAME_INTENT, from (that cosine, reward) of its rewarded retrievals,
    shrunk to 0 with CONDITION_PRIOR pseudo-observations (0 when it was never used elsewhere)."""
    elsewhere = [r for cos, r in rewards if cos < SAME_INTENT]
    return sum(elsewhere) / (len(elsewhere) + CONDITION_PRIOR)


def phase_b(candidates: list[Candidate], params: RetrieveParams, sim_stats: tuple[float, float],
            rng: random.Random, q_stats: tuple[float, float] = (0.0, Q_PRIOR_STD)) -> bool:
    """Score `candidates` in place and mark the k2 selected; return True if ε-exploration fired."""
    if not candidates:
        return False
    sims = np.array([c.similarity for c in candidates], dtype=np.float64)
    mean, std = (params.sim_mean, params.sim_std) if params.sim_mean is not None else sim_stats
    z_sim = zscores(sims, mean, std)
    z_q = utility_z(candidates, params, q_stats)  # memrl: over all candidates, before the q_min filter (as the authors)
    scores = (1 - params.lam) * z_sim + params.lam * z_q
    for c, zs, zq, s in zip(candidates, z_sim, z_q, scores):
        c.z_sim, c.z_q, c.score = float(zs), float(zq), float(s)
    eligible = candidates if params.q_min is None else [c for c in candidates if c.q >= params.q_min]
    if not eligible:
        return False
    newest = -1 if params.selector in STANDARDISED else 1  # ties: the newest memory, or the paper's lowest id

    def rank_key(c: Candidate) -> tuple[float, float, int]:
        return -c.score, -c.similarity, newest * c.memory_id

    ranked = sorted(eligible, key=rank_key)
    k2 = min(params.k2, len(eligible))
    explored = params.epsilon > 0 and rng.random() < params.epsilon
    chosen = rng.sample(eligible, k2) if explored else ranked[:k2]
    if explored:
        chosen.sort(key=rank_key)
    for rank, c in enumerate(chosen):
        c.selected_rank = rank
    return explored


def similarity_stats(vectors: np.ndarray, rng: np.random.Generator, max_pairs: int = 20_000) -> tuple[float, float, int]:
    """Mean and std of cosine similarity between distinct stored intents (unit vectors).

    All pairs for small banks; a uniform sample of `max_pairs` pairs otherwise.
    Returns (mean, std, number of pairs); (0, 1, 0) with fewer than two vectors.
    """
    n = len(vectors)
    if n < 2:
        return 0.0, 1.0, 0
    if n * (n - 1) // 2 <= max_pairs:
        sims = (vectors @ vectors.T)[np.triu_indices(n, k=1)]
    else:
        i = rng.integers(0, n, size=max_pairs)
        j = rng.integers(0, n - 1, size=max_pairs)
        j = j + (j >= i)
        sims = np.einsum("ij,ij->i", vectors[i], vectors[j])
    std = float(sims.std())
    return float(sims.mean()), (std if std > 1e-9 else 1.0), int(len(sims))
