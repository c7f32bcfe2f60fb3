"""Bulk ingest of a file with many memories per task against the embedder alone on its distinct texts (issue 34).

The shape of the file that took over 40 minutes before: ALFWorld's training games × 6, 21,318
memories with 2,304 distinct intents (a task's intent recurs with each of its experiences). Since
each distinct text is embedded once per call, ingesting the file should cost about what embedding
its distinct intents costs, plus the bank's writes. In one run, on the same texts:

- `embedder`: the local embedder alone on the distinct intents (the baseline);
- `ingest_many`: `MemoryBank.ingest_many` of every memory into a new bank (the library);
- `memrl ingest --jsonl FILE`: the whole command as a process (start, model load, parsing, the same
  write), into another new bank;
- `bank_writes_s`: `ingest_many` of every memory with its vector given (the bank's own share);
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
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.perf.bank_perf import memory_text
from memrl_cli.bank import MemoryBank
from memrl_cli.bank.embedders import get_embedder


def records(memories: int, intents: int) -> list[dict[str, str]]:
    """`memories` records over `intents` distinct intents (record i has intent i mod `intents`)."""
    return [{"intent": memory_text(i % intents)[0], "experience": f"attempt {i}: " + memory_text(i)[1]}
            for i in range(memories)]


def measure(memories: int, intents: int, folder: Path, sample: int, rounds: int) -> dict[str, Any]:
    """`rounds` rounds, each timing the embedder, `ingest_many` and the CLI on the same file into new
    banks, the order reversed every other round (so that a drift in machine load favours none); the
    figures are the rounds' medians, the ratios the medians of the per-round ratios."""
    lines = records(memories, intents)
    distinct = list(dict.fromkeys(r["intent"] for r in lines))
    source = folder / "memories.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in lines))
    embedder = get_embedder("local")
    embedder.embed(distinct[:64])  # warm up
    seconds: dict[str, list[float]] = {"embedder": [], "ingest_many": [], "cli": [], "bank_writes": []}
    vectors = None
    for r in range(rounds):
        for kind in ("embedder", "ingest_many", "cli") if r % 2 == 0 else ("cli", "ingest_many", "embedder"):
            start = time.perf_counter()
            if kind == "embedder":
                vectors = embedder.embed(distinct)
            elif kind == "ingest_many":
                with MemoryBank(folder / f"library-{r}.db") as bank:
                    bank.ingest_many(lines)
                    assert bank.count() == memories
            else:
                subprocess.run([sys.executable, "-m", "memrl_cli", "ingest", "--jsonl", str(source), "--db",
                                str(folder / f"cli-{r}.db")], check=True, capture_output=True)
            seconds[kind].append(time.perf_counter() - start)
        assert vectors is not None
        given = [{**line, "vector": vectors[i % intents].tolist()} for i, line in enumerate(lines)]
        with MemoryBank(folder / f"writes-{r}.db") as bank:  # the bank's own share: the same write, vectors given
            bank.ingest("warm-up task", "warm-up experience", vector=vectors[0].tolist())  # the embedder's fingerprint
            start = time.perf_counter()
            bank.ingest_many(given)
            seconds["bank_writes"].append(time.perf_counter() - start)
    start = time.perf_counter()
    embedder.embed([r["intent"] for r in lines[:sample]])
    old_estimate = (time.perf_counter() - start) * memories / sample

    def ratios(kind: str) -> list[float]:
        return [e / k for e, k in zip(seconds["embedder"], seconds[kind])]

    median = statistics.median
    return {
        "memories": memories, "distinct_intents": len(distinct), "rounds": rounds, "seconds": seconds,
        "embedder_distinct_s": median(seconds["embedder"]),
        "embedder_distinct_per_s": len(distinct) / median(seconds["embedder"]),
        "ingest_many_s": median(seconds["ingest_many"]), "ingest_many_per_s": memories / median(seconds["ingest_many"]),
        "ingest_many_ratio": median(ratios("ingest_many")), "ingest_many_ratios": ratios("ingest_many"),
        "cli_ingest_jsonl_s": median(seconds["cli"]), "cli_ingest_jsonl_per_s": memories / median(seconds["cli"]),
        "cli_ratio": median(ratios("cli")), "cli_ratios": ratios("cli"),
        "bank_writes_s": median(seconds["bank_writes"]),
        "old_path_estimate_s": old_estimate, "old_path_sample": sample,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=21_318, help="Memories in the file [21318].")
    parser.add_argument("--intents", type=int, default=2_304, help="Distinct intents among them [2304].")
    parser.add_argument("--sample", type=int, default=2_304, help="Intents embedded to estimate the old path [2304].")
    parser.add_argument("--rounds", type=int, default=2, help="Rounds, the order reversed every other one [2].")
    parser.add_argument("--dir", default=None, help="Where to put the scratch banks [a temporary directory].")
    parser.add_argument("--out", default=None, help="Write the figures as JSON here.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        results = measure(args.memories, args.intents, Path(scratch), min(args.sample, args.memories), args.rounds)
    results["machine"] = {"python": platform.python_version(), "platform": platform.platform()}
    print(json.dumps(results, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
