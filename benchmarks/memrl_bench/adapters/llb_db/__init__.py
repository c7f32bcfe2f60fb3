"""Lifelong Agent Bench, database tasks: SQL on an episode's own MySQL database (the adapter, the prompt and reply parser, the episode's database, the grading).

The entry point names this package: `benchmark.LLBDatabase` is loaded on first use (`lazy_adapter`)."""

from memrl_bench.adapters import lazy_adapter

__getattr__ = lazy_adapter(__name__, "LLBDatabase")
