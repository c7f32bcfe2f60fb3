"""Humanity's Last Exam: questions graded by exact match or by a judge model (the adapter, its data, the prompt, local matching, the judge).

The entry point names this package: `benchmark.HLE` is loaded on first use (`lazy_adapter`)."""

from memrl_bench.adapters import lazy_adapter

__getattr__ = lazy_adapter(__name__, "HLE")
