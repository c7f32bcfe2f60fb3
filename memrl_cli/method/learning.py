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


REWARD_WORDS = {"success": SUCCESS_REWARD, "failure": FAILURE_REWARD}  # what a reward may also be given as


def _finite(value: Any, what: str) -> float:
    """`value` as a finite float, or a MemrlError saying what `what` must be."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number):
        raise MemrlError(f"{what}, got {value!r}")
    return number


def check_reward(reward: Any, alpha: Any = DEFAULT_ALPHA, floor: Any = None,
                 bounds: tuple[float, float] = REWARD_RANGE) -> tuple[float, float, float | None]:
    """Validate a reward within `bounds` (inclusive; a number, or `success`/`failure`: 1/-1), a learning rate
    in (0, 1] and an optional floor; return them as floats."""
    if isinstance(reward, str) and reward.strip().lower() in REWARD_WORDS:
        reward = REWARD_WORDS[reward.strip().lower()]
    r = _finite(reward, "the reward must be a finite number (1 for success, -1 for failure, or a value in "
                        "between) or the word success or failure")
    a = _finite(alpha, "alpha (the learning rate) must be a finite number in (0, 1]")
    f = None if floor is None else _finite(floor, "the floor (the lowest Q after an update) must be a finite number")
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
