"""Bulk ingest of a file with many memories per task against the embedder alone on its distinct texts (issue 34).

The shape of the file that took over 40 minutes before: ALFWorld's training games × 6, 21,318
memories with 2,304 distinct intents (a task's intent recurs with each of its experiences). Since
each distinct text is embedded once per call, ingesting the file should cost about what embedding
its distinct intents costs, plus the bank's writes. In one run, on the same texts:

- `embedder`: the local embedder alone on the distinct intents (the baseline);
- `ingest_many`: `MemoryBank.ingest_many` of every memory into a new bank (the library);
- `memrl ingest --jsonl FILE`: the whole command as a process (start, model load, parsing, the same
  write), into another new bank;
- `old_path_estimate_s`: the seconds the embedder alone takes on every intent, duplicates included,
  which is what a call cost before (each memory's intent embedded) — measured on a sample and scaled.

Rates are memories per second; the ratios are the baseline's seconds over each measurement's. The
embedder is warmed up first (model load is not part of the baseline; it is part of the CLI figure).

    python -m benchmarks.perf.bulk_ingest --out bulk_ingest.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.perf.bank_perf import memory_text
from memrl_cli.bank import MemoryBank
from memrl_cli.embed import get_embedder


def records(memories: int, intents: int) -> list[dict[str, str]]:
    """`memories` records over `intents` distinct intents (record i has intent i mod `intents`)."""
    return [{"intent": memory_text(i % intents)[0], "experience": f"attempt {i}: " + memory_text(i)[1]}
            for i in range(memories)]


def measure(memories: int, intents: int, folder: Path, sample: int) -> dict[str, Any]:
    lines = records(memories, intents)
    distinct = list(dict.fromkeys(r["intent"] for r in lines))
    source = folder / "memories.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in lines))
    embedder = get_embedder("local")
    embedder.embed(distinct[:64])  # warm up
    start = time.perf_counter()
    embedder.embed(distinct)
    baseline = time.perf_counter() - start
    start = time.perf_counter()
    embedder.embed([r["intent"] for r in lines[:sample]])
    old_estimate = (time.perf_counter() - start) * memories / sample
    with MemoryBank(folder / "library.db") as bank:
        start = time.perf_counter()
        bank.ingest_many(lines)
        library = time.perf_counter() - start
        assert bank.count() == memories
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "memrl_cli", "ingest", "--jsonl", str(source), "--db",
                    str(folder / "cli.db")], check=True, capture_output=True)
    cli = time.perf_counter() - start
    return {
        "memories": memories, "distinct_intents": len(distinct),
        "embedder_distinct_s": baseline, "embedder_distinct_per_s": len(distinct) / baseline,
        "ingest_many_s": library, "ingest_many_per_s": memories / library, "ingest_many_ratio": baseline / library,
        "cli_ingest_jsonl_s": cli, "cli_ingest_jsonl_per_s": memories / cli, "cli_ratio": baseline / cli,
        "old_path_estimate_s": old_estimate, "old_path_sample": sample,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=21_318, help="Memories in the file [21318].")
    parser.add_argument("--intents", type=int, default=2_304, help="Distinct intents among them [2304].")
    parser.add_argument("--sample", type=int, default=2_304, help="Intents embedded to estimate the old path [2304].")
    parser.add_argument("--dir", default=None, help="Where to put the scratch banks [a temporary directory].")
    parser.add_argument("--out", default=None, help="Write the figures as JSON here.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        results = measure(args.memories, args.intents, Path(scratch), min(args.sample, args.memories))
    results["machine"] = {"python": platform.python_version(), "platform": platform.platform()}
    print(json.dumps(results, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
