"""Lifelong Agent Bench, operating-system tasks: shell commands in a Debian machine per sample (the adapter; the machines are memrl_bench.environments.os_machines).

The entry point names this package: its adapter class is `benchmark.LLBOperatingSystem`, loaded on first use, so
importing a part (the data, the prompt) does not import the adapter and what it needs."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "LLBOperatingSystem":
        from memrl_bench.adapters.llb_os.benchmark import LLBOperatingSystem

        return LLBOperatingSystem
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
