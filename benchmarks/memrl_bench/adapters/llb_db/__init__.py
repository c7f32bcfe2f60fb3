"""Lifelong Agent Bench, database tasks: SQL on an episode's own MySQL database (the adapter, the prompt and reply parser, the episode's database, the grading).

The entry point names this package: its adapter class is `benchmark.LLBDatabase`, loaded on first use, so
importing a part (the data, the prompt) does not import the adapter and what it needs."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "LLBDatabase":
        from memrl_bench.adapters.llb_db.benchmark import LLBDatabase

        return LLBDatabase
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
