"""The built-in benchmarks, one folder each, registered as `memrl.benchmarks` entry points that name
the folder's package (`memrl_bench.adapters.alfworld:AlfworldBenchmark`, …); `llb_common` holds what
the two Lifelong Agent Bench adapters share."""
