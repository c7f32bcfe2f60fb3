"""The learning rule: Q ← Q + α(R − Q), and its replay from the reward ledger.

Every change of a memory's Q is a ledger row, so Q is a materialised view of the ledger:
`replay` recomputes it from the memory's initial Q and its rows in order. Rows are of two
kinds: `reward` (the rule above, then the optional floor) and `set` (Q assigned outright,
by a merge of duplicate memories or a reset).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from memrl_cli.errors import MemrlError
from memrl_cli.validators import is_finite

DEFAULT_ALPHA = 0.3
SUCCESS_REWARD = 1.0
FAILURE_REWARD = -1.0
REWARD_RANGE = (FAILURE_REWARD, SUCCESS_REWARD)  # the rewards a bank accepts unless its meta widens it


def check_reward(reward: Any, alpha: Any = DEFAULT_ALPHA, floor: Any = None,
                 bounds: tuple[float, float] = REWARD_RANGE) -> tuple[float, float, float | None]:
    """Validate a reward within `bounds` (inclusive), a learning rate in (0, 1] and an optional floor;
    return them as floats."""
    try:
        r, a = float(reward), float(alpha)
        f = None if floor is None else float(floor)
    except (TypeError, ValueError):
        raise MemrlError(f"reward, alpha and floor must be numbers, got {reward!r}, {alpha!r}, {floor!r}") from None
    if not (math.isfinite(r) and math.isfinite(a) and (f is None or math.isfinite(f))):
        raise MemrlError("reward, alpha and floor must be finite numbers (no NaN or inf)")
    if not 0 < a <= 1:
        raise MemrlError(f"alpha must be in (0, 1], got {a}")
    if not bounds[0] <= r <= bounds[1]:
        raise MemrlError(f"reward must be in [{number(bounds[0])}, {number(bounds[1])}] (the bank's reward range), "
                         f"got {number(r)}")
    return r, a, f


def number(value: float) -> str:
    """A float as people write it: 5 and -0.5, not 5.0; exact (1.0000001 stays so)."""
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def check_reward_range(low: Any, high: Any) -> tuple[float, float]:
    """Validate a bank's reward range: two finite numbers, low < high."""
    if not (is_finite(low) and is_finite(high) and low < high):
        raise MemrlError(f"a reward range is two finite numbers MIN < MAX, got {low!r}, {high!r}")
    return float(low), float(high)


def q_update(q: float, reward: float, alpha: float, floor: float | None = None) -> float:
    """One step of the MemRL rule: move Q a fraction α of the way to the reward."""
    new_q = q + alpha * (reward - q)
    if not math.isfinite(new_q):
        raise MemrlError(f"a reward of {reward} would make Q overflow; use rewards of ordinary size")
    return new_q if floor is None else max(floor, new_q)


def replay(q_init: float, rows: Iterable[dict[str, Any]]) -> float:
    """Recompute Q from its initial value and its ledger rows, oldest first."""
    q = q_init
    for row in rows:
        if row["kind"] == "set":
            q = row["q_after"]
        else:
            q = q_update(q, row["reward"], row["alpha"], row["q_floor"])
    return q
