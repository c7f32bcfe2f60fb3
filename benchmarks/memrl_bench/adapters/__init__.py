"""The built-in benchmarks, each with its data loader and checker (registered as `memrl.benchmarks` entry points)."""
