"""The built-in benchmarks, one folder each, registered as `memrl.benchmarks` entry points that name
the folder's package (`memrl_bench.adapters.alfworld:AlfworldBenchmark`, …); `llb_common` holds what
the two Lifelong Agent Bench adapters share."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_adapter(package: str, class_name: str) -> Callable[[str], Any]:
    """A benchmark package's module `__getattr__`: its adapter class `class_name`, from `package.benchmark`,
    loaded on first use. The entry point names the package, so importing one of its parts (the data, the
    prompt) does not import the adapter and what the adapter needs."""
    def __getattr__(name: str) -> Any:
        if name == class_name:
            return getattr(importlib.import_module(f"{package}.benchmark"), class_name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return __getattr__
