"""Two-phase retrieval, as in MemRL (arXiv 2601.03192); by default exactly the paper's rule.

Phase A (similarity recall): the k1 memories most similar to the query (cosine over intent
embeddings), keeping only those at or above `threshold`.
Phase B (value-aware selection): score each candidate by

    score = (1 − λ)·z(sim) + λ·z(Q)

and take the k2 best. λ = 0 is plain similarity RAG; λ = 1 ranks the recalled set by Q only.
z(sim) and z(Q) standardise over the candidate set (population std; std 1 when there is one
candidate or all values are equal, so the term is 0); z(Q) is clipped to ±3 as in the authors'
code. Ties, in both phases and for every selector and λ, go to the NEWEST memory (highest id):
one rule for every method, so similarity-only retrieval (`rag`) is not stuck with a repeated
task's oldest memories. Similarities are compared at a declared resolution, `SIM_RESOLUTION`
(1e-6): identical intents differ by float32 rounding (~1e-7, depending on the row a memory holds
in a matrix product or an engine's index), and such a difference is no difference. Each
similarity within the resolution of a higher one takes that one's value (`tie_levels`), in Phase
A and in Phase B, on every engine and index, so tied memories are ordered by id alone and a spread
of the candidates below the resolution gives z(sim) 0.

Departures from the paper are named switches, off by default (docs/method.md lists them with
their measured effects; `DEPARTURES` names them):

* `recall="groups"`: the authors' code's key groups: memories whose intents have cosine
  ≥ `group_threshold` form one group, k1 counts groups, every member of a recalled group is a
  candidate with its group's similarity (its best member's), or with its own (`member_similarity`);
  the search reads `pool × SEARCH_WIDTH` memories and the candidate pool keeps the `pool` most
  similar (newest first among ties);
* `sim_stats="bank"`: z(sim) with the bank's own similarity statistics (`calibration`) instead of
  the candidates'; `sim_mean`/`sim_std` give fixed constants (the authors' per-benchmark ones);
* `selector="memrl-conditioned"`: the one alternative Phase B kept in the product (see
  `conditioned_utility`): a memory's utility for *this* query from the rewards it earned at similar
  queries, and elsewhere from its record at other tasks.

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
SIM_RESOLUTION = 1e-6  # similarities closer than this are equal (float32 rounding of one vector is ~1e-7)
RECALLS = ("memories", "groups")
SIM_STATS = ("candidates", "bank")
SELECTORS = ("memrl", "memrl-conditioned")
SEARCH_WIDTH = 4  # grouped recall searches pool × this many memories, then groups them
CONDITION_TAU = 0.02  # query-similarity kernel width of `memrl-conditioned`
CONDITION_PRIOR = 1.0  # pseudo-observations behind its prior
SAME_INTENT = 0.99  # a query this close to a memory's intent is the memory's own task
Q_SCALE = 0.5  # `memrl-conditioned`: a utility is divided by this (a prior std of Q for rewards ±1)
# The departures from the paper's rule: each a RetrieveParams field, off (the paper's value) by default.
DEPARTURES = {"recall": "memories", "member_similarity": False, "sim_stats": "candidates",
              "selector": "memrl"}
FILTER_COLUMNS = ("source", "scope")  # the memory columns retrieval filters on, by shell-style patterns
# Retrieval's filters: (column, patterns) pairs; a memory passes when, for each pair with patterns, its
# column matches one of them (`Store.matches`; the pattern None matches no value: a memory without a scope).
Filters = tuple[tuple[str, tuple[str | None, ...]], ...]


def patterns(value: Any, name: str, none: bool = False) -> tuple[Any, ...]:
    """A tuple of non-empty pattern strings (one string is one pattern), and with `none` the pattern None
    (no value); a MemrlError otherwise."""
    found = (value,) if isinstance(value, str) else value or ()
    if not isinstance(found, (list, tuple)) or not all(isinstance(p, str) and p or none and p is None for p in found):
        raise MemrlError(f"{name} must be non-empty {name[:-1]} patterns, got {value!r}")
    return tuple(found)


@dataclass(frozen=True)
class RetrieveParams:
    """The knobs of both phases (paper defaults; `DEPARTURES` are the switches away from the paper)."""

    k1: int = 5
    k2: int = 3
    lam: float = 0.5
    threshold: float = 0.5
    epsilon: float = 0.0
    seed: int | None = None
    sim_mean: float | None = None
    sim_std: float | None = None
    q_min: float | None = None
    recall: str = "memories"
    group_threshold: float = 0.9
    pool: int = 64
    member_similarity: bool = False
    sim_stats: str = "candidates"
    selector: str = "memrl"
    sources: tuple[str, ...] = ()  # only memories from a source matching one of these patterns (`*`, `?`)
    # Only memories whose scope matches one of these patterns (`user:alice`, `team:*`; None: no scope).
    scopes: tuple[str | None, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", patterns(self.sources, "sources"))
        object.__setattr__(self, "scopes", patterns(self.scopes, "scopes", none=True))
        for setting, chosen, choices in (("recall", self.recall, RECALLS), ("sim_stats", self.sim_stats, SIM_STATS),
                                         ("selector", self.selector, SELECTORS)):
            if chosen not in choices:
                raise MemrlError(f"{setting} must be one of {', '.join(choices)}, got {chosen!r}")
        if not isinstance(self.member_similarity, bool):
            raise MemrlError(f"member_similarity must be true or false, got {self.member_similarity!r}")
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

    def departures(self) -> dict[str, Any]:
        """The switches of `DEPARTURES` that this call turns on, with their values."""
        return {k: getattr(self, k) for k, off in DEPARTURES.items() if getattr(self, k) != off}

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
    utility: float | None = None  # `memrl-conditioned`: the query-conditioned utility
    transfer: float = 0.0  # `memrl-conditioned`: the memory's transfer record (`transfer_record`)
    extra: dict[str, Any] = field(default_factory=dict)


def zscore_stats(values: np.ndarray) -> tuple[float, float]:
    """The (mean, std) `zscores` standardises `values` by: theirs (population std; 1 if one value or all equal)."""
    std = float(values.std()) if len(values) > 1 else 1.0
    return float(values.mean()), (std if std > 1e-9 else 1.0)


def zscores(values: np.ndarray, mean: float | None = None, std: float | None = None,
            clip: float | None = None) -> np.ndarray:
    """Standardise `values` by the given mean/std, else their own (`zscore_stats`)."""
    own_mean, own_std = zscore_stats(values) if mean is None or std is None else (mean, std)
    mean = own_mean if mean is None else mean
    std = own_std if std is None else (std if std > 1e-9 else 1.0)
    z = (values - mean) / std
    return np.clip(z, -clip, clip) if clip is not None else z


def tie_levels(sims: np.ndarray) -> np.ndarray:
    """`sims` (float64) compared at `SIM_RESOLUTION`: from the highest down, each value within the resolution
    of the highest value of its run takes that value, so values that differ by rounding become equal and the
    result does not depend on the order they came in."""
    sims = np.asarray(sims, dtype=np.float64)
    if len(sims) < 2:
        return sims.copy()
    order = np.argsort(-sims, kind="stable")
    levels = sims[order]
    lead = levels[0]
    for i in range(1, len(levels)):
        if lead - levels[i] < SIM_RESOLUTION:
            levels[i] = lead
        else:
            lead = levels[i]
    out = np.empty_like(sims)
    out[order] = levels
    return out


def newest_first(ids: np.ndarray, sims: np.ndarray) -> np.ndarray:
    """The order of (ids, sims) best first, the newest memory (highest id) first among equal similarities
    (equal at `SIM_RESOLUTION`: `tie_levels`)."""
    return np.lexsort((-ids, -tie_levels(sims)))


def phase_a(similarities: np.ndarray, ids: np.ndarray, k1: int, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """Top-k1 (ids, float64 similarities at `SIM_RESOLUTION`: `tie_levels`) by similarity, best first, newest
    first among ties, keeping sim ≥ threshold (at the resolution). One partition and one comparison over the whole array; the rest
    works on the few survivors.
    """
    top = np.flatnonzero(similarities >= np.float64(threshold) - SIM_RESOLUTION)  # float64, as reported
    if len(top) > k1:  # keep everything tied with the k1-th best (within the resolution), so ties break by id below
        kth = np.partition(similarities[top], len(top) - k1)[len(top) - k1]
        top = top[similarities[top] >= np.float64(kth) - SIM_RESOLUTION]
    sims, ids = tie_levels(similarities[top]), ids[top]
    order = np.lexsort((-ids, -sims))[:k1]
    return ids[order], sims[order]


def group_recall(ids: np.ndarray, sims: np.ndarray, vectors: np.ndarray, k1: int, group_threshold: float,
                 pool: int, member_similarity: bool = False) -> tuple[list[int], list[float]]:
    """Grouped Phase A (the `recall="groups"` switch) over searched candidates: (ids, similarities) of the pool.

    Candidates join the first group whose best member has cosine ≥ `group_threshold` with them
    (identical vectors always do); the first k1 groups are recalled. Each member gets its group's
    similarity (its best member's, as the authors' key), or its own with `member_similarity`; the pool
    keeps the `pool` most similar members by their own similarity (newest first among ties), best first.
    """
    order = newest_first(ids, sims)
    ids, sims, vectors = ids[order], sims[order], vectors[order]
    first: dict[bytes, int] = {}
    same = np.array([first.setdefault(v.tobytes(), i) for i, v in enumerate(vectors)])  # identical vectors: one id
    joins: list[list[bool]] = []  # per group (its best member first seen): which rows join it
    best: list[float] = []  # per group: its best member's similarity
    members: list[tuple[int, int]] = []  # (group, row)
    for row in range(len(ids)):
        group = next((g for g, joined in enumerate(joins) if joined[row]), None)
        if group is None:
            if len(joins) == k1:
                continue
            joins.append((((vectors @ vectors[row]) >= group_threshold) | (same == same[row])).tolist())
            best.append(float(sims[row]))
            group = len(joins) - 1
        members.append((group, row))
        if len(members) == pool:  # rows come best first: the pool is full with the most similar
            break
    if member_similarity:
        return [int(ids[row]) for _, row in members], [float(sims[row]) for _, row in members]
    kept = sorted(members, key=lambda m: (-best[m[0]], -int(ids[m[1]])))  # by the group's similarity, newest first
    return [int(ids[row]) for _, row in kept], [best[group] for group, _ in kept]


def utility_z(candidates: list[Candidate], params: RetrieveParams) -> np.ndarray:
    """The Phase-B utility term of `params.selector`, in z units, clipped to ±Z_CLIP."""
    if params.selector == "memrl":
        return zscores(np.array([c.q for c in candidates], dtype=np.float64), clip=Z_CLIP)
    utility = np.array([0.0 if c.utility is None else c.utility for c in candidates], dtype=np.float64)
    return zscores(utility, 0.0, Q_SCALE, clip=Z_CLIP)


def conditioned_utility(rewards: list[tuple[float, float]], prior: float = 0.0) -> float:
    """`memrl-conditioned`: a memory's utility for this query from (query cosine, reward) of its past
    rewarded retrievals, each weighted exp(−(1 − cos)/CONDITION_TAU), averaged with CONDITION_PRIOR
    pseudo-observations of `prior`: 0 at the memory's own task, its `transfer_record` elsewhere."""
    weights = [math.exp(-(1.0 - cos) / CONDITION_TAU) for cos, _ in rewards]
    total = sum(w * r for w, (_, r) in zip(weights, rewards))
    return (total + CONDITION_PRIOR * prior) / (sum(weights) + CONDITION_PRIOR)


def transfer_record(rewards: list[tuple[float, float]]) -> float:
    """A memory's help to tasks other than its own: the mean reward of its uses at queries whose
    cosine to its intent is below SAME_INTENT, from (that cosine, reward) of its rewarded retrievals,
    shrunk to 0 with CONDITION_PRIOR pseudo-observations (0 when it was never used elsewhere)."""
    elsewhere = [r for cos, r in rewards if cos < SAME_INTENT]
    return sum(elsewhere) / (len(elsewhere) + CONDITION_PRIOR)


def phase_b(candidates: list[Candidate], params: RetrieveParams, sim_stats: tuple[float, float] | None,
            rng: random.Random) -> bool:
    """Score `candidates` in place and mark the k2 selected; return True if ε-exploration fired.

    `sim_stats`: fixed (mean, std) for z(sim), or None to standardise over the candidates (the paper).
    """
    if not candidates:
        return False
    sims = tie_levels(np.array([c.similarity for c in candidates], dtype=np.float64))
    for c, level in zip(candidates, sims):
        c.similarity = float(level)
    mean, std = (params.sim_mean, params.sim_std) if params.sim_mean is not None else sim_stats or (None, None)
    z_sim = zscores(sims, mean, std)
    if mean is None and sims.max() - sims.min() < SIM_RESOLUTION:  # no spread: no similarity term
        z_sim = np.zeros_like(sims)
    z_q = utility_z(candidates, params)  # memrl: over all candidates, before the q_min filter (as the authors)
    scores = (1 - params.lam) * z_sim + params.lam * z_q
    for c, zs, zq, s in zip(candidates, z_sim, z_q, scores):
        c.z_sim, c.z_q, c.score = float(zs), float(zq), float(s)
    eligible = candidates if params.q_min is None else [c for c in candidates if c.q >= params.q_min]
    if not eligible:
        return False

    def rank_key(c: Candidate) -> tuple[float, float, int]:  # ties: the more similar, then the newest memory
        return -c.score, -c.similarity, -c.memory_id

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
