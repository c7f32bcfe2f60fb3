"""A mini-batch in flight: one ALFWorld epoch with an LLM that answers every call after 1 s, against its floors.

The harness (`run_benchmark`, method memrl, `--epochs` epochs [1] of `--games` games of `valid_unseen`,
batch 32, `--workers` processes, `--concurrency` episodes in flight [the batch size]) plays against a
real HTTP server on 127.0.0.1 that answers each chat call (agent turns and distillation) after
`--delay` seconds, with the scripted walkthrough agent of `harness_floor`. Two floors:

- L, the latency floor: for each mini-batch, its longest episode's number of LLM calls × delay,
  summed over the batches (the calls of one episode are sequential; the batches are too);
- E, the CPU floor: the same games' walkthroughs replayed in the same number of processes (once per epoch).

Target (issue 17): harness ≤ 1.3 × max(L, E), with ≤ 4 GB resident for 32 episodes in flight.
Resident memory is the sum of VmRSS over this process and its descendants, sampled every 0.2 s.
Also measured: what one more worker process costs (spawn, imports, TextWorld: seconds and MB),
against what one more episode in flight on a thread costs (MB).

    python -m benchmarks.perf.inflight [--games 64] [--epochs 1] [--workers 2] [--concurrency N] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from memrl_bench.adapters.alfworld.benchmark import AlfworldBenchmark
from memrl_bench.framework.config import BenchConfig
from memrl_bench.framework.harness import run_benchmark
from memrl_bench.framework.sampling import stratified_sample
from memrl_bench.framework.worker import init_pool_worker
from benchmarks.perf.harness_floor import ARCHIVE, SPLIT, replay_all, scripted_agent, timed_with_cpu
from memrl_bench.framework.llm import LLMSettings

BATCH = 32
TARGET_RATIO = 1.3
TARGET_RSS_MB = 4096


def rss_mb(pid: int) -> float:
    """VmRSS of one process in MB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def tree_rss_mb(root: int) -> float:
    """Resident memory (MB) of process `root` and all its descendants, from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier += children
    return sum(rss_mb(pid) for pid in tree)


class RssSampler:
    """Peaks of this process's tree (`peak`) and of its descendants alone (`children`) while the block runs."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval, self.peak, self.children, self.start = interval, 0.0, 0.0, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = tree_rss_mb(os.getpid())
            self.peak, self.children = max(self.peak, total), max(self.children, total - rss_mb(os.getpid()))
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self.start = tree_rss_mb(os.getpid())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _warm_worker() -> float:
    """In a fresh worker: import TextWorld (as the first game does); return this process's RSS in MB."""
    from memrl_bench.adapters.alfworld.game import textworld_parts

    textworld_parts()
    return rss_mb(os.getpid())


def worker_cost(data: str, settings: LLMSettings) -> dict[str, float]:
    """Seconds and MB of one harness worker process, spawned and initialised as the harness does it."""
    initargs = ("alfworld", data, None, {"train_split": SPLIT}, settings)
    started = time.perf_counter()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=init_pool_worker,
                             initargs=initargs) as pool:
        rss = pool.submit(_warm_worker).result()
        seconds = time.perf_counter() - started
    return {"worker_start_s": seconds, "worker_rss_mb": rss}


def latency_floor(episodes: list[dict[str, Any]], delay: float) -> float:
    """Σ over batches (of every epoch) of (most LLM calls of one episode) × delay."""
    longest: dict[tuple[int, int], int] = {}
    for e in episodes:
        batch = (e["epoch"], e["batch"])
        longest[batch] = max(longest.get(batch, 0), e["usage"]["calls"])
    return sum(longest.values()) * delay


def measure(games: int = 64, workers: int = 2, concurrency: int | None = None, delay: float = 1.0,
            data: str | None = None, epochs: int = 1) -> dict[str, Any]:
    """The epochs, their two floors, the peak resident memory and the cost of a worker process."""
    from benchmarks.testing.chat_server import ScriptedChatServer

    data = data or os.environ.get("ALFWORLD_DATA") or str(ARCHIVE)
    adapter = AlfworldBenchmark(data=data, train_split=SPLIT)  # unpacks the data once, untimed
    tasks = stratified_sample(adapter.tasks(SPLIT), games, 0, "train")  # the games `limit` makes the harness play
    adapter.examples()  # built from training games once and cached, untimed
    load_before = os.getloadavg()
    floor, floor_s, floor_cpu = timed_with_cpu(lambda: replay_all(tasks * epochs, workers))
    agent = scripted_agent(tasks)
    with tempfile.TemporaryDirectory() as scratch, \
            ScriptedChatServer(lambda request: {"content": agent(request), "delay": delay}) as server:
        config = BenchConfig(benchmark="alfworld", method="memrl", epochs=epochs, batch_size=BATCH, limit=games,
                             data=data, options={"train_split": SPLIT})
        marks: list[float] = []  # when the loop started (epoch 1 includes the workers' start), when each epoch ended
        settings = LLMSettings(model="scripted", base_url=server.base_url, api_key="test", max_retries=0, timeout=120,
                               concurrency=concurrency)
        with RssSampler() as rss:
            summary, harness_s, harness_cpu = timed_with_cpu(lambda: run_benchmark(
                config, settings, runs_dir=scratch, workers=workers, on_progress=lambda event, info: marks.extend(
                    [time.perf_counter()] if event in ("start", "epoch_done") else [])))
        episodes = [json.loads(line) for line in (Path(summary["bank"]).parent / "episodes.jsonl").open()]
        in_flight = server.max_in_flight
        cost = worker_cost(data, settings)
    floor_l = latency_floor(episodes, delay)
    bound = max(floor_l, floor_s)
    in_flight_episodes = min(concurrency or BATCH, BATCH)
    per_episode = (rss.children - workers * cost["worker_rss_mb"]) / in_flight_episodes  # above idle workers
    return {"games": len(tasks), "epochs": epochs, "epoch_s": [b - a for a, b in zip(marks, marks[1:])],
            "batch": BATCH, "workers": workers, "concurrency": in_flight_episodes, "delay_s": delay,
            "harness_s": harness_s, "harness_cpu": harness_cpu, "latency_floor_s": floor_l, "cpu_floor_s": floor_s,
            "cpu_floor_cpu": floor_cpu, "ratio": harness_s / bound, "target_ratio": TARGET_RATIO,
            "peak_rss_mb": rss.peak, "rss_before_mb": rss.start, "workers_peak_rss_mb": rss.children, "target_rss_mb": TARGET_RSS_MB,
            "max_requests_in_flight": in_flight, "llm_requests": len(server.requests),
            "harness_successes": sum(e["success"] for e in episodes), "floor_successes": sum(w for w, _ in floor),
            "harness_steps": sum(e["steps"] for e in episodes), "floor_steps": sum(s for _, s in floor),
            "mb_per_episode_in_flight": per_episode, **cost,
            "load_average_before": load_before, "load_average_after": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=64, help="Games per epoch (a stratified sample) [64].")
    parser.add_argument("--epochs", type=int, default=1, help="Epochs of those games [1].")
    parser.add_argument("--workers", type=int, default=2, help="Worker processes, for the harness and the floor [2].")
    parser.add_argument("--concurrency", type=int, default=None, help="Episodes in flight [the batch size, 32].")
    parser.add_argument("--delay", type=float, default=1.0, help="Seconds before each chat answer [1.0].")
    parser.add_argument("--data", default=None, help="ALFWorld data [$ALFWORLD_DATA, else the shared archive].")
    parser.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    args = parser.parse_args()
    if args.epochs < 1:
        parser.error("--epochs must be at least 1")
    r = measure(args.games, args.workers, args.concurrency, args.delay, args.data, args.epochs)
    if args.json:
        print(json.dumps(r, indent=2))
        return
    ok = r["ratio"] <= TARGET_RATIO and r["peak_rss_mb"] <= TARGET_RSS_MB
    print(f"{r['games']} games × {r['epochs']} epoch(s) ({', '.join(f'{s:.1f}' for s in r['epoch_s'])} s), "
          f"batch {r['batch']}, {r['workers']} workers, {r['concurrency']} in flight, "
          f"{r['delay_s']:.1f} s per call: harness {r['harness_s']:.1f} s (CPU {r['harness_cpu']:.0%}); "
          f"L {r['latency_floor_s']:.0f} s, E {r['cpu_floor_s']:.1f} s (CPU {r['cpu_floor_cpu']:.0%}); "
          f"ratio {r['ratio']:.2f} (target <= {TARGET_RATIO}); peak RSS {r['peak_rss_mb']:.0f} MB "
          f"(target <= {TARGET_RSS_MB}); {'met' if ok else 'NOT MET'}")
    print(f"a worker process: {r['worker_start_s']:.1f} s to start, {r['worker_rss_mb']:.0f} MB; an episode in flight "
          f"on a thread: {r['mb_per_episode_in_flight']:.1f} MB; requests in flight at most {r['max_requests_in_flight']}; "
          f"load average {r['load_average_before'][0]:.2f} before, {r['load_average_after'][0]:.2f} after")


if __name__ == "__main__":
    main()
