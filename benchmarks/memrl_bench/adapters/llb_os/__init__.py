"""Lifelong Agent Bench, operating-system tasks: shell commands in a Debian machine per sample (the adapter; the machines are memrl_bench.environments.os_machines).

The entry point names this package: `benchmark.LLBOperatingSystem` is loaded on first use (`lazy_adapter`)."""

from memrl_bench.adapters import lazy_adapter

__getattr__ = lazy_adapter(__name__, "LLBOperatingSystem")
