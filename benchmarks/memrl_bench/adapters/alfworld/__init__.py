"""ALFWorld: the text household games (the adapter, its games' data, the game environment, the prompt and reply parser, the authors' few-shot examples, the gold walkthroughs).

The entry point names this package: its adapter class is `benchmark.AlfworldBenchmark`, loaded on first use, so
importing a part (the data, the prompt) does not import the adapter and what it needs."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "AlfworldBenchmark":
        from memrl_bench.adapters.alfworld.benchmark import AlfworldBenchmark

        return AlfworldBenchmark
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
