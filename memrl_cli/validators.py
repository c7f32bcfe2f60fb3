"""The checks of a value that comes from outside (a flag, a YAML key, a JSON field, a stored row).

Python counts `True` as the integer 1 and lets NaN through comparisons; a user means neither.
These are the one definition of "a whole number" and "a finite number" for the core and the harness.
"""

from __future__ import annotations

import math
from typing import Any

from memrl_cli.errors import MemrlError


def is_whole(value: Any) -> bool:
    """An `int` that is not a `bool`."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite(value: Any) -> bool:
    """An `int` or `float` that is not a `bool`, NaN or infinite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def finite(name: str, value: Any) -> float:
    """`value` if it is a finite number, else a one-line `MemrlError` naming `name`."""
    if not is_finite(value):
        raise MemrlError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def whole(name: str, value: Any, minimum: int | None = None) -> int:
    """`value` if it is a whole number (at least `minimum`, when given), else a one-line `MemrlError`."""
    if not is_whole(value) or (minimum is not None and value < minimum):
        least = f" of at least {minimum}" if minimum is not None else ""
        raise MemrlError(f"{name} must be a whole number{least}, got {value!r}")
    return int(value)
