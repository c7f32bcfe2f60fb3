"""The runtime-learning harness: MemRL's loop over epochs of the same task stream.

Read top to bottom, this is the method:

    for each epoch, for each mini-batch of training tasks:
        retrieve memories for every task (two phases; a receipt per episode)
        play the episodes concurrently (worker processes: LLM calls overlap, environments use the cores)
        in ONE transaction: reward each receipt's memories with R (+1 success / −1 failure),
            store every episode as a new memory (script if it succeeded, reflection if not),
            record the episodes and mark the batch done
    evaluate on held-out splits before training and after each epoch (retrieval, no writes)

The bank is the checkpoint: a killed run resumed with `resume=RUN_ID` skips the committed
batches and ends with the same metrics as an uninterrupted run (given a deterministic LLM).
Adapters (see `benchmarks.protocol`) only know their environment.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import math
import multiprocessing
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks import metrics, registry
from benchmarks.protocol import Benchmark, Episode, Task
from memrl_cli import __version__, runs
from memrl_cli.bank import MemoryBank, MemoryInput
from memrl_cli.errors import MemrlError
from memrl_cli.experience import distil
from memrl_cli.learn import check_reward
from memrl_cli.llm import ChatClient, LLMSettings
from memrl_cli.retrieve import RetrieveParams

METHODS = {"memrl": 0.5, "rag": 0.0, "none": None}  # method → default λ (None: no memory at all)
METHODS.update({"memrl-cal": 0.5, "memrl-ucb": 0.5, "memrl-ctx": 0.5})  # improved Phase-B selectors (docs/learning.md)
SELECTORS = {"memrl-cal": "calibrated", "memrl-ucb": "ucb", "memrl-ctx": "conditioned"}  # method → Phase-B selector


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class BenchConfig:
    """Everything that decides a run's outcome (stored with the run; no secrets)."""

    benchmark: str
    method: str = "memrl"
    epochs: int = 10
    batch_size: int = 32
    limit: int | None = None
    eval_splits: list[str] = field(default_factory=list)
    eval_limit: int | None = None
    eval_every: int = 1
    k1: int = 5
    k2: int = 3
    lam: float | None = None
    threshold: float = 0.5
    epsilon: float = 0.0
    alpha: float = 0.3
    success_reward: float = 1.0
    failure_reward: float = -1.0
    q_init: float = 0.0
    q_floor: float | None = None
    seed: int = 0
    data: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise MemrlError(f"unknown method {self.method!r}; choose {', '.join(METHODS)}")
        if self.lam is None:
            self.lam = METHODS[self.method]
        elif self.method == "rag" and self.lam != 0:
            raise MemrlError("rag is similarity-only retrieval (λ = 0); use --method memrl --lambda X for another λ")
        if isinstance(self.eval_splits, str):
            self.eval_splits = [s.strip() for s in self.eval_splits.split(",") if s.strip()]
        if not isinstance(self.eval_splits, list) or not all(isinstance(s, str) for s in self.eval_splits):
            raise MemrlError("eval_splits must be a list of split names")
        if not isinstance(self.options, dict):
            raise MemrlError("options must be a mapping of adapter option names to values")
        for name in ("epochs", "batch_size", "eval_every", "k1", "k2", "limit", "eval_limit"):
            value = getattr(self, name)
            if value is None and name in ("limit", "eval_limit"):
                continue
            if not _whole(value) or value < 1:
                raise MemrlError(f"{name} must be a whole number of at least 1, got {value!r}")
        if not _whole(self.seed):
            raise MemrlError(f"seed must be a whole number, got {self.seed!r}")
        for name in ("threshold", "epsilon", "alpha", "success_reward", "failure_reward", "q_init", "q_floor"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value)):
                raise MemrlError(f"{name} must be a finite number, got {value!r}")
        check_reward(1.0, self.alpha)  # α in (0, 1]
        if self.method != "none":
            self.retrieve_params(0)  # validates k1, k2, λ, threshold, ε

    @property
    def uses_memory(self) -> bool:
        """False for the no-memory baseline."""
        return self.method != "none"

    def retrieve_params(self, seed: int) -> RetrieveParams:
        """Retrieval parameters for one episode (ε-greedy seeded per episode)."""
        return RetrieveParams(k1=self.k1, k2=self.k2, lam=float(self.lam or 0.0), threshold=self.threshold,
                              epsilon=self.epsilon, seed=seed, selector=SELECTORS.get(self.method, "memrl"))


@dataclass
class Played:
    """What a worker sends back: the episode, its memory text (training only), token usage."""

    episode: Episode
    experience: str | None
    usage: dict[str, int]


# -- worker side (runs in each worker process) -----------------------------------------

_ADAPTER: Benchmark | None = None
_LLM: ChatClient | None = None


def _init_worker(name: str, data: str | None, limit: int | None, options: dict[str, Any],
                 settings: LLMSettings) -> None:
    global _ADAPTER, _LLM
    _ADAPTER = registry.create(name, data, limit, options)
    _LLM = ChatClient(settings)
    atexit.register(_ADAPTER.close)


def _play(task: Task, memories: list[dict[str, Any]], learn: bool) -> Played:
    assert _ADAPTER is not None and _LLM is not None
    episode = _ADAPTER.run_episode(task, memories, _LLM)
    experience = None
    if learn and not episode.env_error:
        experience = distil(_LLM, task.query, episode.trajectory, episode.success) if uses_llm(_ADAPTER) \
            else f"TRAJECTORY:\n{episode.trajectory}"  # an LLM-free adapter's trajectory is its memory
    return Played(episode, experience, _LLM.take_usage())


def uses_llm(adapter: Any) -> bool:
    """False for an adapter declaring `uses_llm = False` (scripted testbeds): no LLM check, no distillation."""
    return bool(getattr(adapter, "uses_llm", True))


class _InProcess(Executor):
    """`workers=0`: play episodes one by one in this process (debugging, tiny runs)."""

    def __init__(self, initargs: tuple) -> None:
        _init_worker(*initargs)

    def map(self, fn: Callable, *iterables: Any, timeout: float | None = None, chunksize: int = 1) -> Iterator:  # type: ignore[override]
        return (fn(*args) for args in zip(*iterables))


# -- the run ---------------------------------------------------------------------------

def episode_seed(seed: int, phase: str, split: str, epoch: int, position: int) -> int:
    """A stable per-episode seed for ε-greedy, independent of batch timing and resumes."""
    digest = hashlib.sha256(f"{seed}/{phase}/{split}/{epoch}/{position}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


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

    def records(self) -> list[dict[str, Any]]:
        """Every committed episode of the run."""
        return runs.episodes(self.bank, self.run_id)

    def play_batch(self, pool: Executor, phase: str, split: str, epoch: int, batch: int, start: int,
                   tasks: list[Task]) -> None:
        """Retrieve, play and commit one mini-batch."""
        learn = phase == "train" and self.config.uses_memory
        vectors: list[list[float] | None] = [None] * len(tasks)
        retrievals: list[Any] = [None] * len(tasks)
        if self.config.uses_memory:
            vectors = [v.tolist() for v in self.bank.embedder.embed([t.query for t in tasks])]
            retrievals = [self.bank.retrieve(t.query, self.config.retrieve_params(
                              episode_seed(self.config.seed, phase, split, epoch, start + i)),
                              vector=vectors[i], record=learn)
                          for i, t in enumerate(tasks)]
        memories = [r.memories if r else [] for r in retrievals]
        played: list[Played] = []
        for result in pool.map(_play, tasks, memories, [learn] * len(tasks)):
            played.append(result)
            self.on_progress("episode", {"phase": phase, "split": split, "epoch": epoch,
                                         "success": result.episode.success})
        self.commit(phase, split, epoch, batch, start, tasks, retrievals, vectors, played)

    def commit(self, phase: str, split: str, epoch: int, batch: int, start: int, tasks: list[Task],
               retrievals: list[Any], vectors: list[list[float] | None], played: list[Played]) -> None:
        """Rewards, new memories, episode rows and the batch marker: one transaction."""
        c = self.config
        source = f"run:{self.run_id}"
        rows = []
        with self.bank.transaction():
            for i, (task, retrieval, vector, p) in enumerate(zip(tasks, retrievals, vectors, played)):
                ep = p.episode
                reward = c.success_reward if ep.success else c.failure_reward
                memory_ids = [m["id"] for m in retrieval.memories] if retrieval else []
                new_id = None
                if p.experience is not None:
                    if retrieval and retrieval.id is not None and memory_ids:
                        self.bank.reward_many([{"retrieval_id": retrieval.id, "reward": reward, "alpha": c.alpha,
                                                "floor": c.q_floor, "source": source}])
                    new_id = self.bank.ingest_many([MemoryInput(
                        intent=task.query, experience=p.experience, outcome="success" if ep.success else "failure",
                        task_id=task.id, source=source, q=c.q_init, vector=vector,
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

    def loop(self, pool: Executor) -> None:
        """All epochs; committed batches are skipped, so this also resumes."""
        c = self.config
        done = runs.completed_batches(self.bank, self.run_id)
        if self.evals:
            self.evaluate(pool, 0, done)
        for epoch in range(1, c.epochs + 1):
            self.on_progress("epoch", {"epoch": epoch})
            for batch, start in enumerate(range(0, len(self.train), c.batch_size)):
                if ("train", "train", epoch, batch) not in done:
                    self.play_batch(pool, "train", "train", epoch, batch, start, self.train[start:start + c.batch_size])
            if self.evals and (epoch % c.eval_every == 0 or epoch == c.epochs):
                self.evaluate(pool, epoch, done)
            self.on_progress("epoch_done", {"epoch": epoch, "summary": metrics.summarise(self.records())})


def run_benchmark(config: BenchConfig, settings: LLMSettings, *, bank_path: str | None = None,
                  runs_dir: str = "runs", resume: str | None = None, workers: int = 4,
                  on_progress: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run (or resume) one benchmark with one method; return its summary (also written to disk)."""
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
        train = adapter.tasks(adapter.train_split)[:config.limit]
        evals = {s: adapter.tasks(s)[:config.eval_limit] for s in config.eval_splits}
        needs_llm = uses_llm(adapter)
    finally:
        adapter.close()
    if not train:
        raise MemrlError(f"{config.benchmark}: no training tasks (check --limit and the task filters)")
    if needs_llm:
        ChatClient(settings).check()
    out_dir.mkdir(parents=True, exist_ok=True)
    bank = MemoryBank(bank_path, index="numpy")  # a long-lived process: the in-memory scan is fastest
    try:
        if not resume:  # config.json first: a run killed at any point after this can be resumed
            (out_dir / "config.json").write_text(json.dumps(
                {"run_id": run_id, "bank": os.path.abspath(bank_path), "config": asdict(config),
                 "llm": settings.to_dict(), "code_version": code_version()}, indent=2))
        if not runs.has_run(bank, run_id):
            runs.create_run(bank, run_id, config.benchmark, config.method, asdict(config),
                            {"agent": settings.model, "base_url": settings.base_url,
                             "embedder": bank.embedder.spec}, config.seed, code_version())
        run = Run(config, bank, run_id, out_dir, train, evals, on_progress or (lambda event, data: None))
        # the bank is the truth: rewrite the episode log from it, then append as batches commit
        (out_dir / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run.records()))
        runs.set_status(bank, run_id, "running")
        initargs = (config.benchmark, config.data, None, config.options, settings)
        with _executor(workers, initargs) as pool:
            run.loop(pool)
        summary = finish(run, settings)
        runs.set_status(bank, run_id, "finished")
        return summary
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
                               initializer=_init_worker, initargs=initargs)
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


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
    """Accuracy (solid) and CSR (dashed) per epoch, one colour per run/method."""
    import matplotlib

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


def progress_printer(stream: Any = sys.stderr) -> Callable[[str, dict[str, Any]], None]:
    """A plain progress callback: one line per finished epoch (for logs and non-terminals)."""
    def report(event: str, data: dict[str, Any]) -> None:
        if event == "epoch_done":
            s = data["summary"]
            e = data["epoch"]
            stream.write(f"epoch {e}: accuracy {s['accuracy'].get(e, 0):.3f}  CSR {s['csr'].get(e, 0):.3f}\n")
            stream.flush()
    return report
