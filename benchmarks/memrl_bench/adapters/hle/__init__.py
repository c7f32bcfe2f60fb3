"""Humanity's Last Exam: questions graded by exact match or by a judge model (the adapter, its data, the prompt, local matching, the judge).

The entry point names this package: its adapter class is `benchmark.HLE`, loaded on first use, so
importing a part (the data, the prompt) does not import the adapter and what it needs."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "HLE":
        from memrl_bench.adapters.hle.benchmark import HLE

        return HLE
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
