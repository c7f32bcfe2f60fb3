"""The runtime-learning harness: MemRL's loop over epochs of the same task stream.

Read top to bottom, this is the method:

    for each epoch, for each mini-batch of training tasks:
        retrieve memories for every task (two phases; a receipt per episode)
        play the episodes concurrently (up to --concurrency in flight, on threads in --workers processes:
            while one waits for the LLM, the others proceed; the processes use the cores;
            each process then loads the games it will play in the next batch)
        in ONE transaction: reward each receipt's memories with R (+1 success / −1 failure),
            store every episode as a new memory (script if it succeeded, reflection if not),
            record the episodes and mark the batch done
    evaluate on held-out splits before training and after each epoch (retrieval, no writes)

The bank is the checkpoint: a killed run resumed with `resume=RUN_ID` skips the committed
batches and ends with the same metrics as an uninterrupted run (given a deterministic LLM).
Adapters (see `memrl_bench.framework.protocol`) only know their environment.

This module is the loop; its parts are named collaborators: `config` (the methods and
`BenchConfig`), `sampling` (the task streams and episode seeds), `batch` (a batch's retrievals and
its commit), `pool` (the worker processes) and `worker` (what each plays), `reports` (plots,
tables, progress lines), `metrics` (accuracy, CSR, forgetting).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Sequence
from concurrent.futures import as_completed
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from memrl_bench.framework import metrics, registry
from memrl_bench.framework.batch import Batch, commit, recall
from memrl_bench.framework.config import BenchConfig, check_method
from memrl_bench.framework.llm import ChatClient, LLMError, LLMSettings
from memrl_bench.framework.pool import Workers, episode_groups, open_pool
from memrl_bench.framework.protocol import Task
from memrl_bench.framework.reports import plot_learning_curves
from memrl_bench.framework.sampling import episode_seed, stratified_sample
from memrl_bench.framework.worker import Played, can_prepare, load_ahead, play_group, uses_llm
from memrl_cli import __version__
from memrl_cli.ops import runs
from memrl_cli.bank import MemoryBank
from memrl_cli.errors import MemrlError
from memrl_cli.method.learning import number


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


class RunStopped(MemrlError):
    """A run stopped by a failure that leaves it resumable: every committed batch is kept in `out_dir`."""

    def __init__(self, message: str, run_id: str, out_dir: Path, committed: int, cause: str) -> None:
        super().__init__(message)
        self.run_id, self.out_dir, self.committed, self.cause = run_id, out_dir, committed, cause


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM, `memrl_bench.framework.signals`) stopped a run: every committed batch is kept in
    `out_dir`, resumable with `--resume`. Still a KeyboardInterrupt, so that callers stop as before."""

    def __init__(self, run_id: str, out_dir: Path, committed: int) -> None:
        super().__init__(f"run {run_id} interrupted after {committed} committed batch(es)")
        self.run_id, self.out_dir, self.committed = run_id, out_dir, committed


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
    listed: dict[str, int] = field(default_factory=dict)  # each evaluation split's size before sampling
    preparing: bool = False  # the adapter loads its environments ahead (`worker.can_prepare`)
    judge: dict[str, Any] | None = None  # who grades, for an adapter with an LLM judge (its `grader`)
    left_out: dict[str, Any] | None = None  # the tasks the adapter keeps out of its splits, and why (its `left_out`)
    started: bool = False  # a batch was handed to the workers (the first one starts their processes)

    def records(self) -> list[dict[str, Any]]:
        """Every committed episode of the run."""
        return runs.episodes(self.bank, self.run_id)

    def groups(self, n: int) -> list[tuple[list[int], int]]:
        """How a batch of `n` episodes is dealt to the worker processes (`pool.episode_groups`)."""
        return episode_groups(n, self.processes, self.concurrency, self.threaded)

    def play_batch(self, pool: Workers, batch: Batch, upcoming: Sequence[Task] = (), batches: int = 1) -> None:
        """Retrieve, play and commit one mini-batch (of `batches` in its stream); pinned processes then load the
        `upcoming` batch's games."""
        tasks, groups = batch.tasks, self.groups(len(batch.tasks))
        dealt = [[tasks[i] for i in positions] for positions, _ in groups]
        ahead: list[list[Task]] = [[] for _ in groups]
        if pool.pinned:  # the processes start loading the batch's games (if not yet) while the bank recalls
            for g, own in enumerate(dealt):
                pool.submit(g, load_ahead, own)
            for g, (positions, _) in enumerate(self.groups(len(upcoming))):
                if g < len(groups):  # loaded after the group's own games
                    ahead[g] = [upcoming[i] for i in positions]
                else:  # a process with no game in this batch (a stream's short last one) loads its next ones now
                    pool.submit(g, load_ahead, [], [upcoming[i] for i in positions])
        self.on_progress("batch", {"phase": batch.phase, "split": batch.split, "epoch": batch.epoch,
                                   "epochs": self.config.epochs, "index": batch.index, "batches": batches,
                                   "size": len(tasks), "loading": self.preparing,
                                   "starting": 0 if self.started else (self.processes if pool.spawned else 0)})
        self.started = True
        learn = batch.phase == "train" and self.config.uses_memory
        recalled = recall(self.bank, self.config, batch, learn)
        memories = recalled.memories
        played: list[Played | None] = [None] * len(tasks)
        seeds = [episode_seed(self.config.seed, batch.phase, batch.split, batch.epoch, batch.start + i)
                 for i in range(len(tasks))]  # the adapter's draws (`takes_seed`): the same for every method
        calls = {pool.submit(g, play_group, dealt[g], [memories[i] for i in positions], learn, self.config.method,
                             threads, ahead[g], self.config.skip_env_errors, [seeds[i] for i in positions]): positions
                 for g, (positions, threads) in enumerate(groups)}
        for call in as_completed(calls):  # results land in stream order whatever order they finish in
            for i, result in zip(calls[call], call.result()):
                played[i] = result
                self.on_progress("episode", {"phase": batch.phase, "split": batch.split, "epoch": batch.epoch,
                                             "success": result.episode.success})
        rows = commit(self.bank, self.config, self.run_id, batch, recalled, [p for p in played if p is not None])
        with open(self.out_dir / "episodes.jsonl", "a", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")

    def play_stream(self, pool: Workers, phase: str, split: str, epoch: int, tasks: list[Task],
                    done: set[tuple[str, str, int, int]], after: Sequence[Task] = ()) -> None:
        """`tasks` in mini-batches of `batch_size`, skipping the batches `done` (committed before a resume);
        `after`: the tasks of the stream that follows, whose first batch's games the last batch's processes load."""
        size = self.config.batch_size
        batches = -(-len(tasks) // size)
        for index, start in enumerate(range(0, len(tasks), size)):
            if (phase, split, epoch, index) not in done:
                self.play_batch(pool, Batch(phase, split, epoch, index, start, tasks[start:start + size]),
                                tasks[start + size:start + 2 * size] or after[:size], batches)

    def streams(self) -> list[tuple[str, str, int, list[Task] | None]]:
        """Every stream of the run in the order played, as (phase, split, epoch, tasks): the held-out splits
        before training and after every `eval_every`-th and the last epoch, a training stream per epoch
        (tasks None for pass@k's after the first, the training tasks no earlier epoch solved: known once those
        are played)."""
        c = self.config
        out: list[tuple[str, str, int, list[Task] | None]] = []
        for epoch in range(c.epochs + 1):
            if epoch:
                out.append(("train", "train", epoch, None if c.method == "pass@k" and epoch > 1 else self.train))
            if epoch == 0 or epoch % c.eval_every == 0 or epoch == c.epochs:
                out += [("eval", split, epoch, tasks) for split, tasks in self.evals.items()]
        return out

    def retries(self, epoch: int) -> list[Task]:
        """pass@k's stream for `epoch`: the training tasks no earlier epoch solved (the authors' baseline)."""
        solved = {r["task_id"] for r in self.records() if r["phase"] == "train" and r["epoch"] < epoch and r["success"]}
        return [t for t in self.train if t.id not in solved]

    def plan(self) -> dict[str, Any]:
        """How many episodes the run plays, per phase: training tasks per epoch × epochs (at most, for pass@k,
        which retries only the unsolved), each evaluation split's tasks per pass × passes (and its size before
        sampling), the total, and how many a resumed run has already played."""
        streams = self.streams()
        passes = sorted({epoch for phase, _, epoch, _ in streams if phase == "eval"})
        evals = {split: len(tasks) for split, tasks in self.evals.items()}
        total = len(self.train) * self.config.epochs + sum(evals.values()) * len(passes)
        return {"benchmark": self.config.benchmark, "method": self.config.method, "run_dir": str(self.out_dir),
                "train": len(self.train), "epochs": self.config.epochs, "at_most": self.config.method == "pass@k",
                "evals": evals, "listed": dict(self.listed), "eval_passes": passes, "total": total,
                "done": len(self.records())}

    def loop(self, pool: Workers) -> None:
        """All streams; committed batches are skipped, so this also resumes. The last batch of a stream has
        the processes load the next stream's first games, when they are known."""
        done = runs.completed_batches(self.bank, self.run_id)
        streams = self.streams()
        plan = self.plan()
        self.on_progress("start", {"total": plan["total"], "done": plan["done"]})
        for n, (phase, split, epoch, tasks) in enumerate(streams):
            if phase == "train":
                self.on_progress("epoch", {"epoch": epoch})
            following = streams[n + 1] if n + 1 < len(streams) else ("", "", 0, None)  # after the last: nothing
            self.play_stream(pool, phase, split, epoch, self.retries(epoch) if tasks is None else tasks, done,
                             following[3] or [])
            if epoch and following[2] != epoch:
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
        stored, bank_path = runs.run_directory(out_dir)
        try:
            resumed, run_id = BenchConfig(**stored["config"]), stored["run_id"]
        except (KeyError, TypeError):
            raise MemrlError(f"{resume} is not a run directory (no readable config.json)") from None
        if resumed.benchmark != config.benchmark:
            raise MemrlError(f"{resume} is a run of {resumed.benchmark!r}, not {config.benchmark!r}")
        config = resumed
        os.close(run_lock(out_dir, run_id))  # another process on this run: say so now (held from the run's start on)
    else:
        run_id = new_run_id(config)
        out_dir = Path(runs_dir) / run_id
        bank_path = bank_path or str(out_dir / "bank.db")
        config = config.sampled_evaluation()  # --limit N bounds the evaluation too, unless --eval-limit says otherwise
    if os.path.exists(bank_path):  # a damaged, empty or foreign bank file is refused before anything is written
        MemoryBank(bank_path, create=False).close()
    report = on_progress or (lambda event, data: None)
    report("status", {"text": f"reading {config.benchmark}'s tasks"})
    adapter = registry.create(config.benchmark, config.data, None, config.options)
    try:
        unknown = set(config.eval_splits) - set(adapter.eval_splits)
        if unknown:
            raise MemrlError(f"{config.benchmark} has no split {', '.join(sorted(unknown))}; "
                             f"its evaluation splits are {', '.join(adapter.eval_splits) or 'none'}")
        train = stratified_sample(adapter.tasks(adapter.train_split), config.limit, config.seed, "train")
        listed = {s: adapter.tasks(s) for s in config.eval_splits}
        evals = {s: stratified_sample(tasks, config.eval_sample(), config.seed, s) for s, tasks in listed.items()}
        needs_llm = uses_llm(adapter)
        check_method(config.method, config.benchmark, adapter)
        threaded = bool(getattr(adapter, "thread_safe", False))
        preparing = can_prepare(adapter)  # its environments load ahead, in the process that will play them
        judge = adapter.grader(settings) if callable(getattr(adapter, "grader", None)) else None
        left_out = adapter.left_out() if callable(getattr(adapter, "left_out", None)) else None
    finally:
        adapter.close()
    if judge and judge.get("warning"):  # a reward the agent could influence: said before anything else runs
        report("warning", {"text": judge["warning"]})
    if left_out:  # tasks the benchmark keeps out (LLB-OS: weak checks), said before the run starts
        report("note", {"text": left_out["text"]})
    if not train:
        raise MemrlError(f"{config.benchmark}: no training tasks (check --limit and the task filters)")
    concurrency = settings.concurrency or config.batch_size
    processes = max(1, min(workers, concurrency))
    settings = replace(settings, concurrency=concurrency)  # recorded with the run
    if needs_llm:
        report("status", {"text": f"checking the LLM endpoint {settings.base_url}"})
        ChatClient(settings).check()
    out_dir.mkdir(parents=True, exist_ok=True)
    report("status", {"text": "opening the bank and loading its embedder"})
    lock = run_lock(out_dir, run_id)
    try:
        bank = MemoryBank(bank_path, config.embedder, index="numpy")  # long-lived process: the in-memory scan is fastest
    except BaseException:
        os.close(lock)
        raise
    try:
        check_rewards(config, bank.reward_range())
    except MemrlError:
        bank.close()
        raise
    try:
        if not resume:  # config.json first: a run killed at any point after this can be resumed
            (out_dir / "config.json").write_text(json.dumps(
                {"run_id": run_id, "bank": os.path.abspath(bank_path), "config": asdict(config),
                 "llm": settings.to_dict(), "judge": judge, "left_out": left_out,
                 "code_version": code_version()}, indent=2))
        if not runs.has_run(bank, run_id):
            runs.create_run(bank, run_id, config.benchmark, config.method, asdict(config),
                            {"agent": settings.model, "base_url": settings.base_url,
                             "embedder": bank.embedder.spec}, config.seed, code_version())
        run = Run(config, bank, run_id, out_dir, train, evals, report, processes, concurrency, threaded,
                  {s: len(tasks) for s, tasks in listed.items()}, preparing, judge=judge, left_out=left_out)
        report("plan", run.plan())
        # the bank is the truth: rewrite the episode log from it, then append as batches commit
        (out_dir / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run.records()))
        runs.set_status(bank, run_id, "running")
        per_process = replace(settings, concurrency=-(-concurrency // processes))  # each worker's share of the limit
        initargs = (config.benchmark, config.data, None, config.options, per_process)
        with open_pool(min(workers, processes), initargs, pinned=preparing) as pool:
            run.loop(pool)
        summary = finish(run, settings)
        runs.set_status(bank, run_id, "finished")
        return summary
    except LLMError as exc:  # the endpoint failed for good: stop cleanly, resumable from the last commit
        runs.set_status(bank, run_id, "interrupted")
        done = len(runs.completed_batches(bank, run_id))
        raise RunStopped(f"run {run_id} interrupted by an LLM error after {done} committed batch(es), all kept; "
                         f"continue with --resume {out_dir} ({exc})", run_id, out_dir, done, str(exc)) from exc
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM: say where the run is, so that it can be resumed
        runs.set_status(bank, run_id, "interrupted")
        raise RunInterrupted(run_id, out_dir, len(runs.completed_batches(bank, run_id))) from exc
    except BaseException:
        runs.set_status(bank, run_id, "interrupted")
        raise
    finally:
        bank.close()
        os.close(lock)


def run_lock(out_dir: Path, run_id: str) -> int:
    """Hold the run directory's lock (`run.lock`, released by `os.close` or when the process dies), so a
    second process running or resuming the same run stops with one line instead of racing this one."""
    import fcntl

    fd = os.open(out_dir / "run.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise MemrlError(f"run {run_id} is already running in another process (pid {holder}); wait for it to "
                         f"finish or stop it, then continue with --resume {out_dir}") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def check_rewards(config: BenchConfig, bounds: tuple[float, float]) -> None:
    """Refuse, before any episode, rewards the bank would refuse at the first commit."""
    if not config.learns_q:
        return
    for name in ("success_reward", "failure_reward"):
        value = getattr(config, name)
        if not bounds[0] <= value <= bounds[1]:
            raise MemrlError(f"{name} {number(value)} lies outside the bank's reward range [{number(bounds[0])}, "
                             f"{number(bounds[1])}]: choose rewards inside it, or widen the range with "
                             "`memrl config reward_range MIN MAX`")


def finish(run: Run, settings: LLMSettings) -> dict[str, Any]:
    """Write summary.json and the learning-curve PNG; return the summary."""
    records = run.records()
    usage: dict[str, int] = {}
    for r in records:
        for k, v in r["usage"].items():
            usage[k] = usage.get(k, 0) + v
    plot = run.out_dir / "learning_curve.png"
    summary = {"run_id": run.run_id, "benchmark": run.config.benchmark, "method": run.config.method,
               "model": settings.model, "bank": run.bank.path, "run_dir": str(run.out_dir), "plot": None,
               "episodes": len(records), "usage": usage, **metrics.summarise(records)}
    if run.judge is not None:
        summary["judge"] = run.judge
    if run.left_out is not None:
        summary["left_out"] = run.left_out
    if plot_learning_curves([summary], plot):
        summary["plot"] = str(plot)
    (run.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
