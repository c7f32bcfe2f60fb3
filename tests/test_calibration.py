"""memrl_cli.bank.calibration alone, on both engines: the similarity statistics of z(sim) (measured,
refreshed on growth, or fixed)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from bank_parts import connect, seed, unit

from memrl_cli.bank.calibration import Calibration
from memrl_cli.errors import MemrlError


def test_statistics_are_measured_fixed_and_cleared(bank_at: Callable[[str], str]) -> None:
    db = connect(bank_at("b"))
    calibration = Calibration(db)
    assert calibration.similarity_stats() == (0.0, 1.0)  # an empty bank: z(sim) is the raw similarity
    vectors = unit(50)
    seed(db, vectors)
    report = calibration.calibrate()
    sims = (vectors @ vectors.T)[np.triu_indices(50, 1)]
    assert report["stats"]["memories"] == 50 and report["override"] is None
    assert report["used"]["mean"] == pytest.approx(float(sims.mean()), abs=0.05)
    assert calibration.calibrate(mean=0.5, std=0.25)["used"] == {"mean": 0.5, "std": 0.25}
    assert calibration.similarity_stats() == (0.5, 0.25)
    assert calibration.calibrate(clear=True)["used"] == report["used"]
    for bad in ({"mean": 0.5}, {"mean": 0.5, "std": 0.0}, {"mean": 0.5, "std": 0.1, "clear": True}):
        with pytest.raises(MemrlError):
            calibration.calibrate(**bad)  # type: ignore[arg-type]


def test_recalibration_waits_for_growth(bank_at: Callable[[str], str]) -> None:
    db = connect(bank_at("b"))
    calibration = Calibration(db)
    seed(db, unit(40))
    with db.transaction():
        calibration.recalibrate()
    seed(db, unit(3, seed=1))  # 7.5% more: not yet
    with db.transaction():
        calibration.recalibrate(force=False)
    assert db.meta("sim_stats")["memories"] == 40
    seed(db, unit(2, seed=2))  # 12.5% more
    with db.transaction():
        calibration.recalibrate(force=False)
    assert db.meta("sim_stats")["memories"] == 45
