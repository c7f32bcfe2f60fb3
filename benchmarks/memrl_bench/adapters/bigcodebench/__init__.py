"""BigCodeBench: Python tasks checked by their unit tests (the adapter, the screen of a program's source, and the checker's two standalone scripts, bcb_check.py and bcb_processes.py, which the sandbox runs by path).

The entry point names this package: its adapter class is `benchmark.BigCodeBench`, loaded on first use, so
importing a part (the data, the prompt) does not import the adapter and what it needs."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "BigCodeBench":
        from memrl_bench.adapters.bigcodebench.benchmark import BigCodeBench

        return BigCodeBench
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
