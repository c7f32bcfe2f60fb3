"""BigCodeBench: Python tasks checked by their unit tests (the adapter, the screen of a program's source, and the checker's two standalone scripts, bcb_check.py and bcb_processes.py, which the sandbox runs by path).

The entry point names this package: `benchmark.BigCodeBench` is loaded on first use (`lazy_adapter`)."""

from memrl_bench.adapters import lazy_adapter

__getattr__ = lazy_adapter(__name__, "BigCodeBench")
