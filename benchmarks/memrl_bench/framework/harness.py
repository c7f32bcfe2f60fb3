"""The runtime-learning harness: MemRL's loop over epochs of the same task stream.

Read top to bottom, this is the method:

    for each epoch, for each mini-batch of training tasks:
        retrieve memories for every task (two phases; a receipt per episode)
        play the episodes concurrently (up to --concurrency in flight, on threads in --workers processes:
            while one waits for the LLM, the others proceed; the processes use the cores)
        in ONE transaction: reward each receipt's memories with R (+1 success / −1 failure),
            store every episode as a new memory (script if it succeeded, reflection if not),
            record the episodes and mark the batch done
    evaluate on held-out splits before training and after each epoch (retrieval, no writes)

The bank is the checkpoint: a killed run resumed with `resume=RUN_ID` skips the committed
batches and ends with the same metrics as an uninterrupted run (given a deterministic LLM).
Adapters (see `memrl_bench.framework.protocol`) only know their environment.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import math
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from concurrent.futures import wait as wait_for
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from memrl_bench.framework import baselines, metrics, registry, self_rag
from memrl_bench.framework.protocol import LLM, Benchmark, Episode, Task
from memrl_cli import __version__, runs, validators
from memrl_cli.bank import MemoryBank, MemoryInput
from memrl_cli.errors import MemrlError
from memrl_cli.experience import distil
from memrl_cli.learn import check_reward
from memrl_bench.framework.llm import ChatClient, LLMError, LLMSettings
from memrl_cli.retrieve import RetrieveParams
from memrl_cli.settings import check_all, setting

METHODS = {"memrl": 0.5, "rag": 0.0, "none": None}  # method → default λ (None: no memory at all)
METHODS["memp"] = 0.0  # baselines (benchmarks/memrl_bench/framework/baselines.py): MemP retrieves by similarity only
METHODS["reflexion"] = None  # Reflexion: the task's own reflections, no retrieval across tasks
METHODS["self-rag"] = 0.0  # Self-RAG (benchmarks/memrl_bench/framework/self_rag.py): similarity retrieval, then the model's own critique
METHODS["pass@k"] = None  # the authors' pass@k: no memory, each epoch retries only the tasks not yet solved
UNREWARDED = {"memp", "reflexion", "self-rag"}  # memory methods that learn no utility
MEMORYLESS = {"none", "pass@k"}
METHODS.update({"memrl-cal": 0.5, "memrl-ucb": 0.5, "memrl-ctx": 0.5, "memrl-ctxz": 0.5, "memrl-ctxn": 0.5,
                "memrl-ctxnz": 0.5})  # improved Phase-B selectors (docs/learning.md)
SELECTORS = {"memrl-cal": "calibrated", "memrl-ucb": "ucb", "memrl-ctx": "conditioned",
             "memrl-ctxz": "conditioned-z", "memrl-ctxn": "conditioned-n",
             "memrl-ctxnz": "conditioned-nz"}  # method → Phase-B selector


def _at_least_1(name: str, value: Any) -> None:
    validators.whole(name, value, 1)


def _eval_splits(name: str, value: Any) -> None:
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise MemrlError(f"{name} must be a list of split names")


def _options(name: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise MemrlError(f"{name} must be a mapping of adapter option names to values")


def _q_init(name: str, value: Any) -> None:
    if isinstance(value, dict) and set(value) != {"success", "failure"}:
        raise MemrlError(f"q_init must be a number or {{success: X, failure: Y}}, got {value!r}")
    for number in value.values() if isinstance(value, dict) else [value]:
        validators.finite(name, number)


@dataclass
class BenchConfig:
    """Everything that decides a run's outcome (stored with the run; no secrets).

    `q_init` is one number for every new memory or `{success: X, failure: Y}` by outcome (the
    authors' HLE runner: 1.0 / 0.0). `q_min` hides candidates whose Q is below it in Phase B
    (the authors' BCB/LLB: −0.8). `sim_mean`/`sim_std` fix z(sim)'s statistics (the authors'
    per-benchmark constants) instead of the bank's own. `embedder` names the bank's embedding
    model (e.g. `openai:text-embedding-3-large`, the authors'). `config_file` records which
    YAML supplied the settings.
    """

    benchmark: str
    method: str = "memrl"
    epochs: int = setting(10, check=_at_least_1)
    batch_size: int = setting(32, check=_at_least_1)
    limit: int | None = setting(None, check=_at_least_1)
    eval_splits: list[str] = setting(factory=list, check=_eval_splits)
    eval_limit: int | None = setting(None, check=_at_least_1)
    eval_every: int = setting(1, check=_at_least_1)
    k1: int = setting(5, check=_at_least_1)
    k2: int = setting(3, check=_at_least_1)
    lam: float | None = None
    threshold: float = setting(0.5, check=validators.finite)
    epsilon: float = setting(0.0, check=validators.finite)
    alpha: float = setting(0.3, check=validators.finite)
    success_reward: float = setting(1.0, check=validators.finite)
    failure_reward: float = setting(-1.0, check=validators.finite)
    q_init: float | dict[str, float] = setting(0.0, check=_q_init)
    q_floor: float | None = setting(None, check=validators.finite)
    q_min: float | None = setting(None, check=validators.finite)
    sim_mean: float | None = setting(None, check=validators.finite)
    sim_std: float | None = setting(None, check=validators.finite)
    embedder: str | None = None
    seed: int = setting(0, check=validators.whole)
    data: str | None = None
    options: dict[str, Any] = setting(factory=dict, check=_options)
    config_file: str | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise MemrlError(f"unknown method {self.method!r}; choose {', '.join(METHODS)}")
        if self.lam is None:
            self.lam = METHODS[self.method]
        elif self.method in ("rag", "memp", "self-rag") and self.lam != 0:
            raise MemrlError(f"{self.method} is similarity-only retrieval (λ = 0); use --method memrl --lambda X "
                             "for another λ")
        if isinstance(self.eval_splits, str):
            self.eval_splits = [s.strip() for s in self.eval_splits.split(",") if s.strip()]
        check_all(self)
        check_reward(1.0, self.alpha)  # α in (0, 1]
        if self.uses_memory:
            self.retrieve_params(0)  # validates k1, k2, λ, threshold, ε

    @property
    def uses_memory(self) -> bool:
        """False for the no-memory baselines (none, pass@k)."""
        return self.method not in MEMORYLESS

    @property
    def learns_q(self) -> bool:
        """True for the methods that reward the memories they injected (Q ← Q + α(R − Q))."""
        return self.uses_memory and self.method not in UNREWARDED

    def retrieve_params(self, seed: int) -> RetrieveParams:
        """Retrieval parameters for one episode (ε-greedy seeded per episode)."""
        return RetrieveParams(k1=self.k1, k2=self.k2, lam=float(self.lam or 0.0), threshold=self.threshold,
                              epsilon=self.epsilon, seed=seed, sim_mean=self.sim_mean, sim_std=self.sim_std,
                              q_min=self.q_min, selector=SELECTORS.get(self.method, "memrl"))

    def initial_q(self, success: bool) -> float:
        """Q of a new memory from an episode with this outcome."""
        if isinstance(self.q_init, dict):
            return float(self.q_init["success" if success else "failure"])
        return float(self.q_init)


@dataclass
class Played:
    """What a worker sends back: the episode, its memory text (training only), token usage, and the
    memories the answer used when a method narrows the retrieved ones (self-rag; None: all of them)."""

    episode: Episode
    experience: str | None
    usage: dict[str, int]
    used: list[int] | None = None


# -- worker side (runs in each worker process) -----------------------------------------

_ADAPTER: Benchmark | None = None
_LLM: ChatClient | None = None
_STOPPING = False  # set in a worker by SIGTERM: later episodes end at once


def _init_worker(name: str, data: str | None, limit: int | None, options: dict[str, Any],
                 settings: LLMSettings) -> None:
    global _ADAPTER, _LLM
    _ADAPTER = registry.create(name, data, limit, options)
    _LLM = ChatClient(settings)
    atexit.register(_ADAPTER.close)


def _init_pool_worker(*initargs: Any) -> None:
    """A worker process: SIGTERM ends the episode in flight through its cleanups, and every later one."""
    signal.signal(signal.SIGTERM, _stop_worker)
    _init_worker(*initargs)


def _stop_worker(signum: int, frame: Any) -> None:
    global _STOPPING
    _STOPPING = True
    raise SystemExit(128 + signum)


class _Cancelled(BaseException):
    """Ends an episode at its next LLM call: another episode of its group failed, or the worker is stopping."""


class _EpisodeLLM:
    """One episode's view of the worker's `ChatClient`: usage of its own, and cancellable between calls."""

    def __init__(self, client: ChatClient, cancel: threading.Event) -> None:
        self._client = client.scoped()
        self._cancel = cancel

    def chat(self, messages: list[dict[str, Any]], **params: Any) -> str:
        if self._cancel.is_set():
            raise _Cancelled
        return self._client.chat(messages, **params)

    def __getattr__(self, name: str) -> Any:  # settings, take_usage, ...: the client's own
        return getattr(self._client, name)


def _play(task: Task, memories: list[dict[str, Any]], learn: bool, method: str = "memrl",
          cancel: threading.Event | None = None) -> Played:
    if _STOPPING:
        raise SystemExit(128 + signal.SIGTERM)
    if cancel is not None and cancel.is_set():
        raise _Cancelled
    assert _ADAPTER is not None and _LLM is not None
    llm = _EpisodeLLM(_LLM, cancel or threading.Event())
    used = None
    if method == "self-rag":
        episode, used = self_rag.play(_ADAPTER, task, memories, llm)  # type: ignore[arg-type]
    else:
        episode = _ADAPTER.run_episode(task, memories, llm)
    experience = None
    if learn and not episode.env_error:
        experience = _experience(llm, method, task, memories, episode) if uses_llm(_ADAPTER) \
            else f"TRAJECTORY:\n{episode.trajectory}"  # an LLM-free adapter's trajectory is its memory
    return Played(episode, experience, llm.take_usage(), used)


def _play_group(tasks: list[Task], memories: list[list[dict[str, Any]]], learn: bool, method: str,
                threads: int) -> list[Played]:
    """Play episodes in this worker, `threads` at a time (in order); the first failure cancels the others."""
    if threads <= 1:
        return [_play(t, m, learn, method) for t, m in zip(tasks, memories)]
    cancel = threading.Event()
    pool = ThreadPoolExecutor(threads, thread_name_prefix="episode")
    try:
        futures = [pool.submit(_play, t, m, learn, method, cancel) for t, m in zip(tasks, memories)]
        wait_for(futures, return_when=FIRST_EXCEPTION)
        if any(f.done() and f.exception() is not None for f in futures):
            cancel.set()
            for f in futures:
                f.cancel()
            wait_for(futures)
            errors = [e for f in futures if not f.cancelled() and (e := f.exception()) is not None]
            raise next((e for e in errors if not isinstance(e, _Cancelled)), errors[0])
        return [f.result() for f in futures]
    except BaseException:  # Ctrl-C, SIGTERM (the worker is stopping) or a failed episode: end the others
        cancel.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _experience(llm: LLM, method: str, task: Task, memories: list[dict[str, Any]],
                episode: Episode) -> str | None:
    """The memory text an episode leaves under `method` (None: it leaves none)."""
    if method == "memp" and not episode.success:  # adjustment of the top memory used, else nothing (validation)
        return baselines.adjust(llm, memories[0], task.query, episode.trajectory) if memories else None
    if method == "reflexion" and episode.success:  # Reflexion reflects on failed trials only
        return None
    return distil(llm, task.query, episode.trajectory, episode.success)


def check_method(method: str, name: str, adapter: Any) -> None:
    """Refuse, in one line, a method the benchmark cannot run (`adapter`: its class or an instance)."""
    if method == "self-rag" and not self_rag.applies(adapter):
        raise MemrlError(f"self-rag does not apply to {name}: it needs an episode that is one LLM generation graded "
                         "afterwards (bigcodebench, hle), not a multi-step or LLM-free environment")


def uses_llm(adapter: Any) -> bool:
    """False for an adapter declaring `uses_llm = False` (scripted testbeds): no LLM check, no distillation."""
    return bool(getattr(adapter, "uses_llm", True))


class _InProcess(Executor):
    """`workers=0`: play episodes in this process (debugging, tiny runs); `submit` runs at once."""

    def __init__(self, initargs: tuple) -> None:
        _init_worker(*initargs)

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:  # type: ignore[override]
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - handed over as a worker's would be
            future.set_exception(exc)
        return future


def episode_groups(n: int, processes: int, concurrency: int, threaded: bool) -> list[tuple[list[int], int]]:
    """How a batch of `n` episodes is played: (positions, threads) for each call of a worker process.

    Thread-safe adapters: one group per process used, positions dealt round robin (stream order
    clusters task types), threads summing to at most `concurrency`. Otherwise one episode per call,
    so the processes take them as they free up (at most `processes` in flight).
    """
    if not threaded:
        return [([i], 1) for i in range(n)]
    groups = max(1, min(processes, concurrency, n))
    return [(list(range(g, n, groups)), min(concurrency // groups + (g < concurrency % groups), len(range(g, n, groups))))
            for g in range(groups)]


# -- the run ---------------------------------------------------------------------------

def episode_seed(seed: int, phase: str, split: str, epoch: int, position: int) -> int:
    """A stable per-episode seed for ε-greedy, independent of batch timing and resumes."""
    digest = hashlib.sha256(f"{seed}/{phase}/{split}/{epoch}/{position}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def stratified_sample(tasks: list[Task], n: int | None, seed: int, split: str) -> list[Task]:
    """A seeded sample of `n` tasks, stratified by `Task.meta["task_type"]`, kept in stream order.

    Every type gets one task, and the rest is shared in proportion to the types' sizes (largest
    remainder); when `n` is below the number of types, `n` types drawn at random get one each.
    All tasks when `n` is None or not below the split's size. (The first N by id can be a single
    type: the first 200 ALFWorld training games by id are all `examine`.)
    """
    if n is None or n >= len(tasks):
        return list(tasks)
    rng = random.Random(episode_seed(seed, "limit", split, 0, 0))
    groups: dict[str, list[int]] = {}
    for i, task in enumerate(tasks):
        groups.setdefault(str(task.meta.get("task_type", "")), []).append(i)
    types = sorted(groups)
    if n < len(types):  # fewer tasks than types: n distinct types, one task each
        quota = {t: 1 for t in rng.sample(types, n)}
    else:
        spare, rest = n - len(types), len(tasks) - len(types)
        shares = {t: spare * (len(groups[t]) - 1) / rest if rest else 0.0 for t in types}
        quota = {t: 1 + math.floor(shares[t]) for t in types}
        by_remainder = sorted(types, key=lambda t: (-(shares[t] - math.floor(shares[t])), t))
        for t in by_remainder[:n - sum(quota.values())]:
            quota[t] += 1
    chosen = sorted(i for t, k in quota.items() for i in rng.sample(groups[t], k))
    return [tasks[i] for i in chosen]


def code_version() -> str:
    """memrl's version, plus the git commit when running from a checkout."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, text=True,
                             capture_output=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"{__version__}+{sha}" if sha else __version__


def new_run_id(config: BenchConfig) -> str:
    """`<benchmark>-<method>-<UTC time>-<random>`."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{config.benchmark.replace(':', '_').replace('.', '_')}-{config.method}-{stamp}-{os.urandom(2).hex()}"


@dataclass
class Run:
    """A benchmark run in progress: its bank, adapter, tasks and output directory."""

    config: BenchConfig
    bank: MemoryBank
    run_id: str
    out_dir: Path
    train: list[Task]
    evals: dict[str, list[Task]]
    on_progress: Callable[[str, dict[str, Any]], None] = lambda event, data: None
    processes: int = 1  # worker processes (1 for in-process play)
    concurrency: int = 1  # episodes in flight at most
    threaded: bool = False  # the adapter is thread-safe: several episodes per process

    def records(self) -> list[dict[str, Any]]:
        """Every committed episode of the run."""
        return runs.episodes(self.bank, self.run_id)

    def play_batch(self, pool: Executor, phase: str, split: str, epoch: int, batch: int, start: int,
                   tasks: list[Task]) -> None:
        """Retrieve, play and commit one mini-batch."""
        learn = phase == "train" and self.config.uses_memory
        vectors: list[list[float] | None] = [None] * len(tasks)
        retrievals: list[Any] = [None] * len(tasks)
        memories: list[list[dict[str, Any]]] = [[] for _ in tasks]
        if self.config.method == "reflexion":  # the task's own reflections; no retrieval, no receipt
            memories = [baselines.reflexion_memories(self.bank, t.id) for t in tasks]
        elif self.config.uses_memory:
            vectors = [v.tolist() for v in self.bank.embedder.embed([t.query for t in tasks])]
            retrievals = [self.bank.retrieve(t.query, self.config.retrieve_params(
                              episode_seed(self.config.seed, phase, split, epoch, start + i)),
                              vector=vectors[i], record=learn)
                          for i, t in enumerate(tasks)]
            memories = [r.memories if r else [] for r in retrievals]
        played: list[Played | None] = [None] * len(tasks)
        calls = {pool.submit(_play_group, [tasks[i] for i in positions], [memories[i] for i in positions], learn,
                             self.config.method, threads): positions
                 for positions, threads in episode_groups(len(tasks), self.processes, self.concurrency, self.threaded)}
        for call in as_completed(calls):  # results land in stream order whatever order they finish in
            for i, result in zip(calls[call], call.result()):
                played[i] = result
                self.on_progress("episode", {"phase": phase, "split": split, "epoch": epoch,
                                             "success": result.episode.success})
        self.commit(phase, split, epoch, batch, start, tasks, retrievals, memories, vectors,
                    [p for p in played if p is not None])

    def commit(self, phase: str, split: str, epoch: int, batch: int, start: int, tasks: list[Task],
               retrievals: list[Any], memories: list[list[dict[str, Any]]], vectors: list[list[float] | None],
               played: list[Played]) -> None:
        """Rewards, new memories, episode rows and the batch marker: one transaction."""
        c = self.config
        source = f"run:{self.run_id}"
        rows = []
        with self.bank.transaction():
            for i, (task, retrieval, injected, vector, p) in enumerate(zip(tasks, retrievals, memories, vectors,
                                                                           played)):
                ep = p.episode
                reward = c.success_reward if ep.success else c.failure_reward
                memory_ids = [m["id"] for m in injected] if p.used is None else p.used
                new_id = None
                if p.experience is not None and c.method == "memp" and not ep.success:
                    self.bank.revise(memory_ids[0], p.experience)  # MemP's adjustment, in place
                    new_id = memory_ids[0]
                elif p.experience is not None:
                    if c.learns_q and retrieval and retrieval.id is not None and memory_ids:
                        self.bank.reward_many([{"retrieval_id": retrieval.id, "reward": reward, "alpha": c.alpha,
                                                "floor": c.q_floor, "source": source}])
                    new_id = self.bank.ingest_many([MemoryInput(
                        intent=task.query, experience=p.experience, outcome="success" if ep.success else "failure",
                        task_id=task.id, source=source, q=c.initial_q(ep.success), vector=vector,
                        metadata={"run": self.run_id, "epoch": epoch, "status": ep.status, "steps": ep.steps,
                                  "injected": memory_ids, **ep.info})])[0].id
                rows.append({"phase": phase, "split": split, "epoch": epoch, "batch": batch, "position": start + i,
                             "task_id": task.id, "success": ep.success,
                             "reward": reward if phase == "train" and not ep.env_error else None,
                             "steps": ep.steps, "status": ep.status, "env_error": ep.env_error,
                             "retrieval_id": retrieval.id if retrieval else None, "memory_ids": memory_ids,
                             "new_memory_id": new_id, "usage": p.usage})
            runs.record_batch(self.bank, self.run_id, phase, split, epoch, batch, rows)
        with open(self.out_dir / "episodes.jsonl", "a", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")

    def evaluate(self, pool: Executor, epoch: int, done: set[tuple[str, str, int, int]]) -> None:
        """Held-out accuracy with retrieval from the current bank and no writes to memory."""
        for split, tasks in self.evals.items():
            for batch, start in enumerate(range(0, len(tasks), self.config.batch_size)):
                if ("eval", split, epoch, batch) not in done:
                    self.play_batch(pool, "eval", split, epoch, batch, start, tasks[start:start + self.config.batch_size])

    def retries(self, epoch: int) -> list[Task]:
        """pass@k's stream for `epoch`: the training tasks no earlier epoch solved (the authors' baseline)."""
        solved = {r["task_id"] for r in self.records() if r["phase"] == "train" and r["epoch"] < epoch and r["success"]}
        return [t for t in self.train if t.id not in solved]

    def loop(self, pool: Executor) -> None:
        """All epochs; committed batches are skipped, so this also resumes."""
        c = self.config
        done = runs.completed_batches(self.bank, self.run_id)
        evaluations = (1 + sum(1 for e in range(1, c.epochs + 1) if e % c.eval_every == 0 or e == c.epochs)
                       if self.evals else 0)
        total = c.epochs * len(self.train) + evaluations * sum(len(tasks) for tasks in self.evals.values())
        self.on_progress("start", {"total": total, "done": len(self.records())})
        if self.evals:
            self.evaluate(pool, 0, done)
        for epoch in range(1, c.epochs + 1):
            self.on_progress("epoch", {"epoch": epoch})
            train = self.retries(epoch) if c.method == "pass@k" else self.train
            for batch, start in enumerate(range(0, len(train), c.batch_size)):
                if ("train", "train", epoch, batch) not in done:
                    self.play_batch(pool, "train", "train", epoch, batch, start, train[start:start + c.batch_size])
            if self.evals and (epoch % c.eval_every == 0 or epoch == c.epochs):
                self.evaluate(pool, epoch, done)
            self.on_progress("epoch_done", {"epoch": epoch, "summary": metrics.summarise(self.records())})


def run_benchmark(config: BenchConfig, settings: LLMSettings, *, bank_path: str | None = None,
                  runs_dir: str = "runs", resume: str | None = None, workers: int = 4,
                  on_progress: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run (or resume) one benchmark with one method; return its summary (also written to disk).

    `workers` processes play the episodes (0: this process). `settings.concurrency` (unset: the
    batch size) is the most episodes, hence LLM requests, in flight at once across them: a
    thread-safe adapter plays several per process on threads. Neither changes the results.
    """
    if resume:
        out_dir = Path(resume)
        try:
            stored = json.loads((out_dir / "config.json").read_text())
            resumed = BenchConfig(**stored["config"])
            bank_path, run_id = stored["bank"], stored["run_id"]
        except (OSError, ValueError, KeyError, TypeError):
            raise MemrlError(f"{resume} is not a run directory (no readable config.json)") from None
        if resumed.benchmark != config.benchmark:
            raise MemrlError(f"{resume} is a run of {resumed.benchmark!r}, not {config.benchmark!r}")
        config = resumed
    else:
        run_id = new_run_id(config)
        out_dir = Path(runs_dir) / run_id
        bank_path = bank_path or str(out_dir / "bank.db")
    adapter = registry.create(config.benchmark, config.data, None, config.options)
    try:
        unknown = set(config.eval_splits) - set(adapter.eval_splits)
        if unknown:
            raise MemrlError(f"{config.benchmark} has no split {', '.join(sorted(unknown))}; "
                             f"its evaluation splits are {', '.join(adapter.eval_splits) or 'none'}")
        train = stratified_sample(adapter.tasks(adapter.train_split), config.limit, config.seed, "train")
        evals = {s: stratified_sample(adapter.tasks(s), config.eval_limit, config.seed, s) for s in config.eval_splits}
        needs_llm = uses_llm(adapter)
        check_method(config.method, config.benchmark, adapter)
        threaded = bool(getattr(adapter, "thread_safe", False))
    finally:
        adapter.close()
    if not train:
        raise MemrlError(f"{config.benchmark}: no training tasks (check --limit and the task filters)")
    concurrency = settings.concurrency or config.batch_size
    processes = max(1, min(workers, concurrency))
    settings = replace(settings, concurrency=concurrency)  # recorded with the run
    if needs_llm:
        ChatClient(settings).check()
    out_dir.mkdir(parents=True, exist_ok=True)
    bank = MemoryBank(bank_path, config.embedder, index="numpy")  # long-lived process: the in-memory scan is fastest
    try:
        if not resume:  # config.json first: a run killed at any point after this can be resumed
            (out_dir / "config.json").write_text(json.dumps(
                {"run_id": run_id, "bank": os.path.abspath(bank_path), "config": asdict(config),
                 "llm": settings.to_dict(), "code_version": code_version()}, indent=2))
        if not runs.has_run(bank, run_id):
            runs.create_run(bank, run_id, config.benchmark, config.method, asdict(config),
                            {"agent": settings.model, "base_url": settings.base_url,
                             "embedder": bank.embedder.spec}, config.seed, code_version())
        run = Run(config, bank, run_id, out_dir, train, evals, on_progress or (lambda event, data: None),
                  processes, concurrency, threaded)
        # the bank is the truth: rewrite the episode log from it, then append as batches commit
        (out_dir / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run.records()))
        runs.set_status(bank, run_id, "running")
        per_process = replace(settings, concurrency=-(-concurrency // processes))  # each worker's share of the limit
        initargs = (config.benchmark, config.data, None, config.options, per_process)
        with _executor(min(workers, processes), initargs) as pool:
            run.loop(pool)
        summary = finish(run, settings)
        runs.set_status(bank, run_id, "finished")
        return summary
    except LLMError as exc:  # the endpoint failed for good: stop cleanly, resumable from the last commit
        runs.set_status(bank, run_id, "interrupted")
        done = len(runs.completed_batches(bank, run_id))
        raise MemrlError(f"run {run_id} interrupted by an LLM error after {done} committed batch(es), all kept; "
                         f"continue with --resume {out_dir} ({exc})") from exc
    except BaseException:
        runs.set_status(bank, run_id, "interrupted")
        raise
    finally:
        bank.close()


@contextmanager
def _executor(workers: int, initargs: tuple) -> Iterator[Executor]:
    if workers <= 0:
        yield _InProcess(initargs)
        return
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_init_pool_worker, initargs=initargs)
    try:
        yield pool
    except BaseException:  # Ctrl-C, SIGTERM (memrl_bench.framework.signals) or an error: stop the episodes in flight
        _stop_workers(pool)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _stop_workers(pool: ProcessPoolExecutor, grace: float = 15.0) -> None:
    """SIGTERM each worker (it unwinds its episode), then SIGKILL any still alive after `grace` seconds."""
    # ProcessPoolExecutor has no public way to stop busy workers before Python 3.14 (terminate_workers).
    processes = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(grace)
        if process.is_alive():
            process.kill()
            process.join()
    if manager is not None:  # else its wake-up pipe may close while Python's exit handler writes to it (EBADF)
        manager.join(grace)


def finish(run: Run, settings: LLMSettings) -> dict[str, Any]:
    """Write summary.json and the learning-curve PNG; return the summary."""
    records = run.records()
    usage: dict[str, int] = {}
    for r in records:
        for k, v in r["usage"].items():
            usage[k] = usage.get(k, 0) + v
    summary = {"run_id": run.run_id, "benchmark": run.config.benchmark, "method": run.config.method,
               "model": settings.model, "bank": run.bank.path, "episodes": len(records), "usage": usage,
               **metrics.summarise(records)}
    (run.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_learning_curves([summary], run.out_dir / "learning_curve.png")
    return summary


def plot_learning_curves(summaries: list[dict[str, Any]], path: Path) -> None:
    """Accuracy (solid) and CSR (dashed) per epoch, one colour per run/method (skipped without matplotlib)."""
    try:
        import matplotlib
    except ImportError:
        sys.stderr.write(f"memrl: {path.name} not drawn: pip install 'memrl[plots]'\n")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, s in enumerate(summaries):
        colour = f"C{i}"
        epochs = [int(e) for e in s["accuracy"]]
        ax.plot(epochs, list(s["accuracy"].values()), "-o", color=colour, label=f"{s['method']} accuracy")
        ax.plot(epochs, list(s["csr"].values()), "--", color=colour, label=f"{s['method']} CSR")
    ax.set_xlabel("epoch")
    ax.set_ylabel("share of tasks")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{summaries[0]['benchmark']}: runtime learning")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def comparison_table(summaries: list[dict[str, Any]]) -> str:
    """The methods side by side (Markdown): accuracy per epoch, last-epoch accuracy, CSR, forgetting,
    the last evaluation, tokens. For `none` and `pass@k`, CSR after k epochs is pass@k (solved in any
    of k tries); an epoch a method did not play (pass@k once every task is solved) shows "–"."""
    epochs = sorted({e for s in summaries for e in s["accuracy"]})
    head = ["method", *[f"ep {e}" for e in epochs], "last acc", "CSR", "pass@k", "forgetting", "eval", "tokens"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summaries:
        evals = "; ".join(f"{split} {list(v.values())[-1]:.3f}" for split, v in s["eval_accuracy"].items() if v)
        cells = [s["method"], *[f"{s['accuracy'][e]:.3f}" if e in s["accuracy"] else "–" for e in epochs],
                 f"{s['last_epoch_accuracy']:.3f}", f"{s['final_csr']:.3f}",
                 f"{s['final_csr']:.3f}" if s["method"] in MEMORYLESS else "–",
                 f"{s['forgetting_rate']:.3f}", evals or "–", str(s["usage"].get("total_tokens", 0))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_comparison(summaries: list[dict[str, Any]], runs_dir: str) -> dict[str, str]:
    """`<benchmark>-comparison.{png,md,json}` in `runs_dir`: one plot, one table, every summary."""
    stem = Path(runs_dir) / f"{summaries[0]['benchmark'].replace(':', '_')}-comparison"
    paths = {"plot": f"{stem}.png", "table": f"{stem}.md", "summaries": f"{stem}.json"}
    plot_learning_curves(summaries, Path(paths["plot"]))
    Path(paths["table"]).write_text(f"# {summaries[0]['benchmark']}: runtime learning\n\n" + comparison_table(summaries))
    Path(paths["summaries"]).write_text(json.dumps(summaries, indent=2))
    return paths


def epoch_line(summary: dict[str, Any], epoch: int) -> str:
    """An epoch's accuracy and CSR, or why it played nothing (pass@k once every task is solved)."""
    if epoch not in summary["accuracy"]:
        return "nothing to play (every training task already solved)"
    return f"accuracy {summary['accuracy'][epoch]:.3f}  CSR {summary['csr'][epoch]:.3f}"


def progress_printer(stream: Any = sys.stderr) -> Callable[[str, dict[str, Any]], None]:
    """A plain progress callback: one line per finished epoch (for logs and non-terminals)."""
    def report(event: str, data: dict[str, Any]) -> None:
        if event == "epoch_done":
            s = data["summary"]
            e = data["epoch"]
            stream.write(f"epoch {e}: {epoch_line(s, e)}\n")
            stream.flush()
    return report
