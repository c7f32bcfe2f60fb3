"""ALFWorld: the text household games (the adapter, its games' data, the game environment, the prompt and reply parser, the authors' few-shot examples, the gold walkthroughs).

The entry point names this package: `benchmark.AlfworldBenchmark` is loaded on first use (`lazy_adapter`)."""

from memrl_bench.adapters import lazy_adapter

__getattr__ = lazy_adapter(__name__, "AlfworldBenchmark")
