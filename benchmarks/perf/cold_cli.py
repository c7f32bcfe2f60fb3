"""Cold start of the CLI: `memrl retrieve "..." --json` as a whole new process, on a bank made with `local`.

Figures, each the median of several runs, interleaved so that machine load hits them alike:
- a *new* query text each run: Python, the CLI, the bank, and the local embedding model
  (onnxruntime session + tokenizer + two model runs: the fingerprint probe and the query);
- a *repeated* query text: its vector comes from the bank's query cache, so the model is not loaded;
- both again on a second, identical bank with the opt-in sqlite-vec index (`set_index("vec")`),
  which the CLI then searches instead of loading every vector into an in-process matrix;
- the baselines `memrl --help` and `python -c pass`.

The banks hold N memories with the local embedder's fingerprint and synthetic vectors (the
vectors' values do not change the cost of a retrieve).

    python -m benchmarks.perf.cold_cli [--memories 10000] [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.perf.bank_perf import clustered_vectors, records
from memrl_cli.bank import MemoryBank

MEMRL = [sys.executable, "-m", "memrl_cli"]


def wall(command: list[str]) -> float:
    """Seconds for one run of `command` (checked, output discarded)."""
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def make_bank(path: Path, n: int, index: str | None = None) -> None:
    """A bank with the local embedder's fingerprint and `n` memories (and the engine index `index`)."""
    vectors = clustered_vectors(np.random.default_rng(0), n)
    with MemoryBank(path, "local") as bank:
        for lo in range(0, n, 5000):
            bank.ingest_many(list(records(vectors[lo:lo + 5000], lo)))
        if index:
            bank.set_index(index)


def measure(memories: int = 10_000, runs: int = 7, folder: Path | None = None) -> dict[str, Any]:
    """Median wall seconds of each command over `runs` interleaved rounds."""
    repeated = "heat the apple and put it in the fridge"
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        retrieve = {}
        for prefix, index in (("", None), ("vec_", "vec")):
            db = Path(scratch) / f"{prefix}bank.db"
            make_bank(db, memories, index)
            retrieve[prefix] = [*MEMRL, "retrieve", "--json", "--db", str(db)]
            subprocess.run([*retrieve[prefix], repeated], check=True,
                           stdout=subprocess.DEVNULL)  # fills the query cache; warms the page cache
        times: dict[str, list[float]] = {f"{prefix}{kind}": [] for prefix in retrieve
                                         for kind in ("new_query", "repeated_query")}
        times |= {"help": [], "python": []}
        for i in range(runs):
            for prefix, command in retrieve.items():
                times[f"{prefix}new_query"].append(wall([*command, f"clean the mug number {i} and put it on the shelf"]))
                times[f"{prefix}repeated_query"].append(wall([*command, repeated]))
            times["help"].append(wall([*MEMRL, "--help"]))
            times["python"].append(wall([sys.executable, "-c", "pass"]))
    return {"memories": memories, "runs": runs, **{f"{k}_s": statistics.median(v) for k, v in times.items()},
            "samples_s": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=10_000, help="Bank size [10000].")
    parser.add_argument("--runs", type=int, default=7, help="Runs per command [7].")
    args = parser.parse_args()
    print(json.dumps(measure(args.memories, args.runs), indent=2))


if __name__ == "__main__":
    main()
