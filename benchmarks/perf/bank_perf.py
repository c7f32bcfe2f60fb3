"""Performance of the memory bank against plain baselines, in one run.

Measures, on synthetic 384-d embeddings (so no embedding time is counted unless stated):
- retrieve latency (p50/p99 of Phase A + Phase B, query vector given, no receipt) for
  index=numpy (what a bank made by default uses), bit and vec (the opt-in sqlite-vec index, built
  for this and timed), against a numpy flat scan (`matrix @ q` + argpartition over the same
  float32 vectors, in this process), timed interleaved query by query so that load from other
  jobs hits both alike; recall@k1 of each index against exact search;
- reward throughput: `reward_many` in batches and `memrl reward --jsonl` (whole process),
  against a bare SQLite `UPDATE` of Q on the same file;
- ingest throughput with given vectors (against a bare SQLite insert of the same rows) and with
  the local embedder (against the embedder's own batch throughput, in interleaved rounds);
- bank size after VACUUM against text bytes + 4·d·N, as made by default (no sqlite-vec index) and
  with the opt-in sqlite-vec index.

The vectors are clustered like sentence embeddings (a shared direction, clusters of ~20 related
intents; mean cosine between random memories ≈ 0.26) and queries are near a stored intent
(cosine ≈ 0.79), as when a new task resembles an old one. Isotropic random vectors, where no
memory is much closer than another, are the worst case for the bit index: its recall on them is
reported too. Memory texts have typical lengths (intent ~70 B, experience ~600 B).

    python -m benchmarks.perf.bank_perf --sizes 10000,100000 --out bank_perf.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from memrl_cli.bank import MemoryBank
from memrl_cli.bank.embedders import get_embedder
from memrl_cli.method.retrieval import RetrieveParams
from memrl_cli.method.matrix_index import MatrixIndex

DIM = 384
CHUNK = 5000
INDEXES = ("numpy", "bit", "vec")
VERBS = ["heat", "cool", "clean", "examine", "put away", "slice", "find", "move", "wash", "stack"]
THINGS = ["apple", "mug", "tomato", "book", "knife", "pillow", "plate", "lamp", "egg", "bread"]
PLACES = ["microwave", "fridge", "sink", "desk", "drawer", "sofa", "counter", "shelf", "cabinet", "table"]


def unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, as float32."""
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def clustered_vectors(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    """`n` unit vectors: a shared direction plus one of n/20 cluster centres plus noise."""
    common = unit(rng.standard_normal(dim))
    centres = unit(rng.standard_normal((max(n // 20, 1), dim)))
    out = np.empty((n, dim), dtype=np.float32)
    for lo in range(0, n, 100_000):
        hi = min(n, lo + 100_000)
        noise = rng.standard_normal((hi - lo, dim), dtype=np.float32)
        out[lo:hi] = unit(0.9 * common + centres[rng.integers(0, len(centres), hi - lo)] + 0.06 * noise)
    return out


def random_vectors(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    """`n` isotropic random unit vectors (no structure: the worst case for quantised search)."""
    return unit(rng.standard_normal((n, dim), dtype=np.float32))


def near_queries(rng: np.random.Generator, vectors: np.ndarray, count: int) -> np.ndarray:
    """Queries close to stored vectors (a new task like an old one)."""
    picks = vectors[rng.integers(0, len(vectors), count)]
    return unit(picks + 0.04 * rng.standard_normal(picks.shape, dtype=np.float32))


def memory_text(i: int) -> tuple[str, str]:
    """A memory's (intent, experience) of typical length, unique per `i`."""
    intent = f"Your task is to: {VERBS[i % 10]} the {THINGS[i // 10 % 10]} and put it in the {PLACES[i // 100 % 10]} ({i})."
    steps = [f"go to {PLACES[(i + k) % 10]} {k + 1}; take {THINGS[(i + k) % 10]} {k + 1}" for k in range(8)]
    return intent, "SCRIPT: " + " then ".join(steps) + f". TRAJECTORY: {' > '.join(steps)} > done {i}."


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50 and p99 in milliseconds."""
    ms = np.array(samples) * 1000
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99))}


def records(vectors: np.ndarray, start: int) -> Iterator[dict[str, Any]]:
    """Ingest records for `vectors`, numbered from `start`."""
    for i, v in enumerate(vectors.tolist(), start=start):
        intent, experience = memory_text(i)
        yield {"intent": intent, "experience": experience, "vector": v}


def build_bank(location: str | Path, vectors: np.ndarray) -> float:
    """Ingest `vectors` (with texts) in chunks of 5,000 through `ingest_many` into a new bank (a SQLite
    path or a PostgreSQL URL); return memories per second."""
    elapsed = 0.0
    with MemoryBank(location, f"external:perf:{vectors.shape[1]}") as bank:
        for lo in range(0, len(vectors), CHUNK):
            batch = list(records(vectors[lo:lo + CHUNK], lo))  # building the dicts is the caller's cost
            start = time.perf_counter()
            bank.ingest_many(batch)
            elapsed += time.perf_counter() - start
    return len(vectors) / elapsed


def bare_insert(path: Path, vectors: np.ndarray) -> float:
    """The baseline for ingest: the same rows into a bare table, one transaction per chunk."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("CREATE TABLE m (id INTEGER PRIMARY KEY, intent TEXT, experience TEXT, embedding BLOB)")
    elapsed = 0.0
    for lo in range(0, len(vectors), CHUNK):
        rows = [(r["intent"], r["experience"], np.asarray(r["vector"], dtype=np.float32).tobytes())
                for r in records(vectors[lo:lo + CHUNK], lo)]
        start = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("INSERT INTO m (intent, experience, embedding) VALUES (?, ?, ?)", rows)
        conn.execute("COMMIT")
        elapsed += time.perf_counter() - start
    conn.close()
    return len(vectors) / elapsed


def flat_scan(matrix: np.ndarray, query: np.ndarray, k1: int) -> np.ndarray:
    """The retrieval baseline: exact top-k1 rows by dot product, best first."""
    sims = matrix @ query
    top = np.argpartition(-sims, k1 - 1)[:k1]
    return top[np.argsort(-sims[top])]


def measure_retrieve(path: Path, vectors: np.ndarray, queries: np.ndarray, params: RetrieveParams,
                     indexes: tuple[str, ...] = INDEXES) -> dict[str, Any]:
    """Latency of each index against the flat scan, interleaved per query, and recall@k1 against exact."""
    banks = {index: MemoryBank(path, index=index) for index in indexes}
    try:
        for bank in banks.values():  # warm-up: loads the in-process matrix, pages the file in
            bank.retrieve("warm-up", params, vector=queries[0].tolist(), record=False)
        samples: dict[str, list[float]] = {name: [] for name in ("flat_scan", *indexes)}
        found = {index: 0 for index in indexes}
        expected = 0
        for q in queries:
            as_list = q.tolist()
            start = time.perf_counter()
            flat_scan(vectors, q, params.k1)
            samples["flat_scan"].append(time.perf_counter() - start)
            exact = None
            for index, bank in banks.items():
                start = time.perf_counter()
                hit = bank.retrieve("perf query", params, vector=as_list, record=False)
                samples[index].append(time.perf_counter() - start)
                got = {c.memory_id for c in hit.candidates}
                if exact is None:  # the first index is numpy: exact
                    exact = got
                    expected += len(exact)
                found[index] += len(got & exact)
        out: dict[str, Any] = {"queries": len(queries), "flat_scan": percentiles(samples["flat_scan"])}
        for index in indexes:
            out[index] = {**percentiles(samples[index]), "recall_at_k1": found[index] / max(expected, 1)}
        q = queries[0].tolist()
        receipt = [0.0] * min(len(queries), 50)
        for i in range(len(receipt)):
            start = time.perf_counter()
            banks[indexes[0]].retrieve("perf query", params, vector=q)
            receipt[i] = time.perf_counter() - start
        out[f"{indexes[0]}_with_receipt"] = percentiles(receipt)
        return out
    finally:
        for bank in banks.values():
            bank.close()


def bit_recall_random(rng: np.random.Generator, n: int, queries: int, k1: int) -> float:
    """Recall@k1 of the bit index on isotropic random vectors (its worst case), in memory."""
    vectors = random_vectors(rng, n)
    exact, bit = MatrixIndex(), MatrixIndex(bits=True)
    for index in (exact, bit):
        index.extend(np.arange(1, n + 1), vectors)
    found = 0
    for q in random_vectors(rng, queries):
        found += len(set(exact.search(q, k1, -1.0)[0].tolist()) & set(bit.search(q, k1, -1.0)[0].tolist()))
    return found / (k1 * queries)


def measure_size(path: Path, folder: Path) -> dict[str, Any]:
    """Bytes of the bank after `VACUUM INTO` a copy, against text bytes + 4·d·N."""
    conn = sqlite3.connect(path)
    n, text = conn.execute("SELECT count(*), sum(length(CAST(intent AS BLOB)) + length(CAST(experience AS BLOB))) "
                           "FROM memories").fetchone()
    dim = json.loads(conn.execute("SELECT value FROM meta WHERE key = 'embedder'").fetchone()[0])["dim"]
    conn.close()
    copy = folder / "size.db"
    with MemoryBank(path) as bank:
        bank.conn.execute("VACUUM INTO ?", (str(copy),))
    size = os.path.getsize(copy)
    copy.unlink()
    floor = text + 4 * dim * n
    return {"memories": n, "dim": dim, "text_bytes": text, "floor_bytes": floor, "bytes": size,
            "ratio": size / floor, "bytes_per_memory": size / n}


def measure_rewards(folder: Path, batches: int, batch_size: int, cli_rewards: int,
                    rng: np.random.Generator) -> dict[str, Any]:
    """Ledgered Q updates per second on `folder/rewards.db`: `reward_many` batches, `memrl reward --jsonl`,
    bare SQLite UPDATEs."""
    path = folder / "rewards.db"
    with MemoryBank(path) as bank:
        n = bank.count()
    total = max(batches * batch_size, cli_rewards)
    ids = rng.integers(1, n + 1, size=total).tolist()
    rewards = rng.choice([-1.0, 1.0], size=total).tolist()
    out: dict[str, Any] = {"bank_size": n, "batch_size": batch_size, "batches": batches, "cli_rewards": cli_rewards}
    with MemoryBank(path) as bank:
        start = time.perf_counter()
        for b in range(batches):
            bank.reward_many([{"reward": rewards[i], "memory_ids": [ids[i]]}
                              for i in range(b * batch_size, (b + 1) * batch_size)])
        out["reward_many_per_s"] = batches * batch_size / (time.perf_counter() - start)
    lines = folder / "rewards.jsonl"
    lines.write_text("".join(json.dumps({"reward": r, "memory_ids": [m]}) + "\n"
                             for m, r in zip(ids[:cli_rewards], rewards)))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "memrl_cli", "reward", "--jsonl", str(lines), "--db", str(path), "--json"],
                   check=True, stdout=subprocess.DEVNULL)
    out["cli_reward_jsonl_per_s"] = cli_rewards / (time.perf_counter() - start)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = NORMAL")
    start = time.perf_counter()
    for b in range(batches):
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("UPDATE memories SET q = q + 0.3 * (? - q), visits = visits + 1 WHERE id = ?",
                         [(rewards[i], ids[i]) for i in range(b * batch_size, (b + 1) * batch_size)])
        conn.execute("COMMIT")
    out["bare_update_batch_per_s"] = batches * batch_size / (time.perf_counter() - start)
    conn.close()
    return out


def measure_embedded_ingest(folder: Path, n: int, rounds: int) -> dict[str, Any]:
    """Ingest with the local embedder against the embedder's own batch throughput on the same texts.

    `rounds` rounds of `n` new texts, each timing the embedder alone and `ingest_many` on them, in
    alternating order (so that a drift in machine load favours neither); the share is the median
    of the rounds' ratios.
    """
    embedder = get_embedder("local")
    embedder.embed([memory_text(i)[0] for i in range(64)])  # warm up: the first runs are slower
    samples: dict[str, list[float]] = {"embedder": [], "ingest": []}
    shares = []
    with MemoryBank(folder / "embedded.db") as bank:
        bank.ingest("warm-up task", "warm-up experience")  # records the fingerprint: not part of the rate
        for r in range(rounds):
            texts = [memory_text(i) for i in range(r * n, (r + 1) * n)]
            seconds = {}
            for kind in ("embedder", "ingest") if r % 2 == 0 else ("ingest", "embedder"):
                start = time.perf_counter()
                if kind == "embedder":
                    embedder.embed([intent for intent, _ in texts])
                else:
                    bank.ingest_many([{"intent": i, "experience": e} for i, e in texts])
                seconds[kind] = time.perf_counter() - start
                samples[kind].append(n / seconds[kind])
            shares.append(seconds["embedder"] / seconds["ingest"])
    return {"texts": n, "rounds": rounds, "embedder_only_per_s": float(np.median(samples["embedder"])),
            "ingest_local_per_s": float(np.median(samples["ingest"])), "share": float(np.median(shares)),
            "samples_per_s": samples, "shares": shares}


def measure(sizes: list[int], queries: int, folder: Path, params: RetrieveParams, seed: int = 0,
            embed: tuple[int, int] = (512, 6), rewards: tuple[int, int, int] = (20, 1000, 20_000),
            progress: Callable[[str], None] = lambda message: None) -> dict[str, Any]:
    """Every bank figure; the largest size is the one used for rewards and bank size.

    Banks are made as by default (no sqlite-vec index); the opt-in sqlite-vec index is then built
    on each (timed) for its retrieve figures, and the largest bank's size is measured before and after.
    """
    rng = np.random.default_rng(seed)
    results: dict[str, Any] = {"dim": DIM, "k1": params.k1, "k2": params.k2, "threshold": params.threshold,
                               "sizes": []}
    for n in sizes:
        progress(f"building a bank of {n} memories")
        vectors = clustered_vectors(rng, n)
        path = folder / f"bank_{n}.db"
        entry: dict[str, Any] = {"size": n, "ingest_given_vectors_per_s": build_bank(path, vectors),
                                 "ingest_bare_sqlite_per_s": bare_insert(folder / f"bare_{n}.db", vectors)}
        (folder / f"bare_{n}.db").unlink()
        if n == sizes[-1]:
            progress("bank size, and a copy for rewards")
            results["size"] = measure_size(path, folder)
            shutil.copy(path, folder / "rewards.db")  # the bank as made by default, for the rewards
        progress(f"building the opt-in sqlite-vec index on {n} memories")
        with MemoryBank(path) as bank:
            start = time.perf_counter()
            bank.set_index("vec")
            entry["vec_index_build_s"] = time.perf_counter() - start
        if n == sizes[-1]:
            results["size_with_vec_index"] = measure_size(path, folder)
        progress(f"retrieving from {n} memories")
        entry["retrieve"] = measure_retrieve(path, vectors, near_queries(rng, vectors, queries), params)
        entry["bit_recall_random_vectors"] = bit_recall_random(rng, n, min(queries, 100), params.k1)
        del vectors
        results["sizes"].append(entry)
        path.unlink()
    progress("rewards")
    results["rewards"] = measure_rewards(folder, *rewards, rng=rng)
    progress("ingest with the local embedder")
    results["embedded_ingest"] = measure_embedded_ingest(folder, *embed)
    return results


def measure_rewards_only(n: int, folder: Path, seed: int = 0, rewards: tuple[int, int, int] = (20, 1000, 20_000),
                         progress: Callable[[str], None] = lambda message: None) -> dict[str, Any]:
    """The reward figures of `measure` on a bank of `n` memories built as `measure` builds it."""
    rng = np.random.default_rng(seed)
    progress(f"building a bank of {n} memories")
    build_bank(folder / "rewards.db", clustered_vectors(rng, n))
    progress("rewards")
    return {"dim": DIM, "rewards": measure_rewards(folder, *rewards, rng=rng)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000", help="Bank sizes, comma-separated [10000,100000].")
    parser.add_argument("--queries", type=int, default=200, help="Retrievals timed per size and index [200].")
    parser.add_argument("--embed-texts", type=int, default=512, help="Texts per round with the local embedder [512].")
    parser.add_argument("--embed-rounds", type=int, default=6, help="Rounds with the local embedder [6].")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", default=None, help="Where to put the scratch banks [a temporary directory].")
    parser.add_argument("--out", default=None, help="Write the figures as JSON here.")
    parser.add_argument("--rewards-only", action="store_true",
                        help="Only the reward figures, on a bank of the largest size (the 1M target without the rest).")
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]

    def report(message: str) -> None:
        print(message, file=sys.stderr)

    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        if args.rewards_only:
            results = measure_rewards_only(sizes[-1], Path(scratch), args.seed, progress=report)
        else:
            results = measure(sizes, args.queries, Path(scratch), RetrieveParams(recall="groups"), args.seed,
                              (args.embed_texts, args.embed_rounds), progress=report)
    results["machine"] = {"python": platform.python_version(), "platform": platform.platform(),
                          "sqlite": sqlite3.sqlite_version}
    print(json.dumps(results, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
