"""memrl_bench: the runtime-learning harness that plays benchmarks with a memrl bank.

`framework` is the loop and what an adapter implements (`memrl bench` loads it lazily),
`adapters` the built-in benchmarks (the `memrl.benchmarks` entry points), `environments` the
sandboxes and servers they run in. See docs/architecture.md and docs/bench.md.
"""
