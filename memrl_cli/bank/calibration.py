"""A bank's own statistics for Phase B's z-scores: the similarity statistics of z(sim) (measured
between stored intents and refreshed as the bank grows, or fixed by the user with `memrl calibrate
--mean --std`): z(sim) uses them only with the `sim_stats="bank"` switch (the default standardises
over the candidates, as the paper).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from memrl_cli.bank.connection import BankConnection
from memrl_cli.errors import MemrlError
from memrl_cli.bank.records import now
from memrl_cli.method.retrieval import similarity_stats

RECALIBRATE_GROWTH = 0.1  # refresh the similarity statistics when the bank grew by this share (or 1000 memories)
SAMPLE = 2000  # memories whose pairwise similarities the statistics are measured on


class Calibration:
    """The z-score statistics of one bank, stored in its meta (`sim_stats`, `sim_stats_override`)."""

    def __init__(self, db: BankConnection) -> None:
        self.db = db

    def similarity_stats(self) -> tuple[float, float]:
        """The bank's (mean, std) for z(sim) under `sim_stats="bank"`: a user override, else its measured ones."""
        def read() -> tuple[float, float]:
            override = self.db.meta("sim_stats_override")
            if override:
                return float(override["mean"]), float(override["std"])
            stats = self.db.meta("sim_stats")
            return (float(stats["mean"]), float(stats["std"])) if stats else (0.0, 1.0)
        return self.db.cached("sim_stats", read)

    def calibrate(self, mean: float | None = None, std: float | None = None, clear: bool = False) -> dict[str, Any]:
        """Recompute the bank's similarity statistics now, or set/clear a fixed override."""
        if clear and (mean is not None or std is not None):
            raise MemrlError("--clear drops the fixed statistics; give it alone, or --mean and --std alone")
        with self.db.transaction():
            if clear:
                self.db.store.delete_meta("sim_stats_override")
            if mean is not None or std is not None:
                if mean is None or std is None or not (math.isfinite(mean) and math.isfinite(std)) or std <= 0:
                    raise MemrlError("give both --mean and --std (std > 0) to fix the similarity statistics")
                self.db.store.set_meta("sim_stats_override", {"mean": mean, "std": std, "set_at": now()})
            else:
                self.recalibrate()
        return {"stats": self.db.meta("sim_stats"), "override": self.db.meta("sim_stats_override"),
                "used": dict(zip(("mean", "std"), self.similarity_stats()))}

    def recalibrate(self, force: bool = True) -> None:
        """Inside a write: refresh `sim_stats` from the stored intents when the bank grew by
        RECALIBRATE_GROWTH (or when forced)."""
        n = self.db.count()
        stats = self.db.meta("sim_stats")
        if not force and stats and n < stats["memories"] * (1 + RECALIBRATE_GROWTH) and n - stats["memories"] < 1000:
            return
        ids = np.array(self.db.store.memory_ids(), dtype=np.int64)
        if len(ids) < 2:
            return
        rng = np.random.default_rng(n)  # deterministic, so a resumed run calibrates as an uninterrupted one
        chosen = rng.choice(ids, size=min(len(ids), SAMPLE), replace=False).tolist()
        vectors = self.db.store.decode([row[0] for row in self.db.by_ids("embedding", "memories", chosen)])
        mean, std, pairs = similarity_stats(vectors, rng)
        self.db.store.set_meta("sim_stats", {"mean": mean, "std": std, "memories": n, "pairs": pairs,
                                             "method": "cosine between stored intents", "updated_at": now()})
