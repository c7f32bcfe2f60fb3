"""Two-phase retrieval, as in MemRL (arXiv 2601.03192).

Phase A (similarity recall): the k1 memories whose intent embeddings have the highest
cosine similarity to the query, keeping only those at or above a threshold.
Phase B (value-aware selection): score each candidate by

    score = (1 − λ)·z(sim) + λ·z(Q)

and take the k2 best. λ = 0 is plain similarity RAG; λ = 1 ranks the recalled set by Q only.

z(Q) standardises Q over the candidate set (population std; std 1 when there is one
candidate or all Q are equal, so ties fall back to similarity) and is clipped to ±3.
z(sim) standardises similarity with the *bank's own* similarity statistics (mean and std of
cosine between stored intents, kept in the bank's meta and refreshed as it grows; see
`calibration`), or with an explicit override. The authors hard-coded per-benchmark
constants here, which is why users could not reproduce their numbers.

With probability ε (seeded), Phase B picks a uniform random k2-subset of the candidates
instead (ε-greedy exploration); the receipt records that it did.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from memrl_cli.errors import MemrlError

Z_CLIP = 3.0


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
    sources: tuple[str, ...] = ()  # only memories from a source matching one of these patterns (`*`, `?`)

    def __post_init__(self) -> None:
        sources = (self.sources,) if isinstance(self.sources, str) else self.sources or ()
        if not isinstance(sources, (list, tuple)) or not all(isinstance(p, str) and p for p in sources):
            raise MemrlError(f"sources must be non-empty source patterns, got {self.sources!r}")
        object.__setattr__(self, "sources", tuple(sources))
        if not (isinstance(self.k1, int) and isinstance(self.k2, int) and self.k1 >= 1 and self.k2 >= 1):
            raise MemrlError(f"k1 and k2 must be positive integers, got k1={self.k1}, k2={self.k2}")
        if self.k1 > 4096:
            raise MemrlError(f"k1 is at most 4096 (sqlite-vec's KNN limit), got {self.k1}")
        for name, value, low, high in (("lambda", self.lam, 0, 1), ("threshold", self.threshold, -1, 1),
                                       ("epsilon", self.epsilon, 0, 1)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and low <= value <= high):
                raise MemrlError(f"{name} must be a number in [{low}, {high}], got {value!r}")
        if (self.sim_mean is None) != (self.sim_std is None):
            raise MemrlError("give both sim_mean and sim_std to override the similarity statistics, or neither")
        if self.sim_mean is not None and not (math.isfinite(self.sim_mean) and math.isfinite(self.sim_std or 0)
                                              and self.sim_std > 0):
            raise MemrlError(f"sim_mean must be finite and sim_std finite and > 0, got {self.sim_mean}, {self.sim_std}")

    def to_dict(self) -> dict[str, Any]:
        """The parameters as stored in a receipt."""
        return asdict(self)


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


def phase_b(candidates: list[Candidate], params: RetrieveParams, sim_stats: tuple[float, float],
            rng: random.Random) -> bool:
    """Score `candidates` in place and mark the k2 selected; return True if ε-exploration fired."""
    if not candidates:
        return False
    sims = np.array([c.similarity for c in candidates], dtype=np.float64)
    qs = np.array([c.q for c in candidates], dtype=np.float64)
    mean, std = (params.sim_mean, params.sim_std) if params.sim_mean is not None else sim_stats
    z_sim = zscores(sims, mean, std)
    z_q = zscores(qs, clip=Z_CLIP)
    scores = (1 - params.lam) * z_sim + params.lam * z_q
    for c, zs, zq, s in zip(candidates, z_sim, z_q, scores):
        c.z_sim, c.z_q, c.score = float(zs), float(zq), float(s)
    ranked = sorted(candidates, key=lambda c: (-c.score, -c.similarity, c.memory_id))
    k2 = min(params.k2, len(candidates))
    explored = params.epsilon > 0 and rng.random() < params.epsilon
    chosen = rng.sample(candidates, k2) if explored else ranked[:k2]
    if explored:
        chosen.sort(key=lambda c: (-c.score, -c.similarity, c.memory_id))
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
