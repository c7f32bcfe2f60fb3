"""Crash safety: kill -9 at random points during bulk ingest, rewards and a benchmark run, then audit.

Each repetition starts a writer in a child process, sends it SIGKILL after a random delay,
and checks the bank it left:

- `PRAGMA integrity_check` passes, every memory has its vector (and its sqlite-vec entry),
  Q equals the replay of the ledger (`inspection.verify`);
- nothing acknowledged is lost: every write the child reported as committed is there;
- nothing is half-written: memories arrive in whole mini-batches (or whole JSONL files) with
  the exact intent and vector they were sent with; each rewarded receipt has one ledger row per
  selected memory; every ledger row is complete; every recorded episode belongs to a committed
  batch;
- a killed `memrl bench benchmarks.testing.toy_benchmark:Passcodes` resumed with `--resume` ends with the same
  metrics as an uninterrupted run.

Writers continue on the same bank across repetitions, so each one also opens a bank that was
just crashed. The toy benchmark's LLM is the scripted Chat Completions server in tests/.

    python -m benchmarks.perf.crash [--repeats 20] [--kinds ingest,reward,bench] [--seed 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from memrl_cli.ops import inspection
from memrl_cli.ops import runs
from memrl_cli.bank import MemoryBank

ROOT = Path(__file__).resolve().parents[2]
DIM = 32
SPEC = f"external:crash:{DIM}"
BATCH = 25  # memories per ingest_many call in the API writer
FILE_LINES = 1000  # memories per `memrl ingest --jsonl` file in the CLI writer
REWARDS = 10  # rewards per reward_many call
FILE_REWARDS = 500  # rewards per `memrl reward --jsonl` file
SEED_MEMORIES = 50  # memories the reward writer rewards
TOY = "benchmarks.testing.toy_benchmark:Passcodes"
METRICS = ("accuracy", "csr", "forgetting", "last_epoch_accuracy", "final_csr", "mean_steps", "episodes")


def vector(i: int) -> np.ndarray:
    """The deterministic unit vector of memory number `i`."""
    v = np.random.default_rng(i).normal(size=DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def record(i: int) -> dict[str, Any]:
    """Memory number `i` (0-based), as sent to the bank."""
    return {"intent": f"bulk task {i}", "experience": f"bulk experience {i} " + "x" * (i * 37 % 3000),
            "vector": vector(i).tolist()}


def child_env() -> dict[str, str]:
    """Environment for writers: the repo importable, no bank from the caller's env."""
    env = {k: v for k, v in os.environ.items() if k not in ("MEMRL_DB", "OPENAI_BASE_URL")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OPENAI_API_KEY"] = "sk-crash-test-not-a-real-key"
    return env


# -- the writers (run in the child process) ------------------------------------------------

def writer_ingest(db: str) -> None:
    """Ingest whole mini-batches forever, printing the memory count after each commit."""
    with MemoryBank(db, SPEC) as bank:
        count = bank.count()
        print(f"committed {count}", flush=True)
        while True:
            bank.ingest_many([record(i) for i in range(count, count + BATCH)])
            count += BATCH
            print(f"committed {count}", flush=True)


def writer_reward(db: str) -> None:
    """Alternate a batch of rewards by memory id and a retrieval rewarded by its receipt, forever,
    printing the ledger size after each commit."""
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    with MemoryBank(db, SPEC) as bank:
        rows = bank.conn.execute("SELECT count(*) FROM rewards").fetchone()[0]
        print(f"committed {rows}", flush=True)
        from memrl_cli.method.retrieval import RetrieveParams

        while True:
            requests = [{"memory_ids": [int(rng.integers(1, SEED_MEMORIES + 1))], "reward": float(rng.choice([-1, 1])),
                         "alpha": 0.3, "source": "crash"} for _ in range(REWARDS)]
            rows += len(bank.reward_many(requests))
            print(f"committed {rows}", flush=True)
            query = rng.normal(size=DIM)
            receipt = bank.retrieve("crash query", RetrieveParams(k1=5, k2=3, threshold=-1), vector=query.tolist())
            rows += len(bank.reward(float(rng.choice([-1, 1])), retrieval_id=receipt.id, source="crash"))
            print(f"committed {rows}", flush=True)


# -- killing ----------------------------------------------------------------------------------

@dataclass
class Kill:
    """One killed writer: when it was killed and what it had acknowledged."""

    delay: float
    acknowledged: int
    exited_before_kill: bool


def run_and_kill(command: list[str], delay: float, cwd: Path = ROOT, ready: Callable[[], bool] | None = None,
                 timeout: float = 120) -> Kill:
    """Start `command`, wait until `ready()` (or its first output line), SIGKILL it `delay` s later."""
    proc = subprocess.Popen(command, cwd=cwd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None and not (ready() if ready else lines):
        time.sleep(0.01)
    time.sleep(delay)
    exited = proc.poll() is not None
    if not exited:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    reader.join()
    stderr = proc.stderr.read()  # type: ignore[union-attr]
    if exited and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed before the kill: {stderr.strip()[-500:]}")
    output = "".join(lines)
    acknowledged = [int(line.split()[1]) for line in output.splitlines() if line.startswith("committed ")]
    return Kill(delay, acknowledged[-1] if acknowledged else -1, exited)


def memrl_command(*args: str) -> list[str]:
    """`python -m memrl_cli ARGS` with this interpreter."""
    return [sys.executable, "-m", "memrl_cli", *args]


# -- audits -----------------------------------------------------------------------------------

def verify(db: str) -> list[str]:
    """`memrl inspect --verify`: integrity, vectors, index coverage, Q = ledger replay."""
    with MemoryBank(db, create=False) as bank:
        return list(inspection.verify(bank)["problems"])


def audit_ingest(db: str, before: int, acknowledged: int, unit: int) -> tuple[int, list[str]]:
    """(memories stored, problems): whole `unit`-memory writes since `before` only, nothing acknowledged
    lost, exact content."""
    problems = verify(db)
    with MemoryBank(db, create=False) as bank:
        rows = bank.conn.execute("SELECT id, intent, experience, embedding FROM memories ORDER BY id").fetchall()
    count = len(rows)
    if (count - before) % unit:
        problems.append(f"{count - before} memories added: not whole {unit}-memory writes (half-written)")
    if count < acknowledged:
        problems.append(f"{count} memories, but {acknowledged} were acknowledged as committed (lost)")
    if acknowledged >= 0 and count > acknowledged + unit:
        problems.append(f"{count} memories, more than the {acknowledged} acknowledged plus one batch")
    for i, (mid, intent, experience, blob) in enumerate(rows):
        expected = record(i)
        if mid != i + 1 or intent != expected["intent"] or experience != expected["experience"]:
            problems.append(f"memory {mid}: content differs from what was sent")
            break
        if not np.allclose(np.frombuffer(blob, dtype=np.float32), vector(i), atol=1e-6):
            problems.append(f"memory {mid}: vector differs from what was sent")
            break
    return count, problems


def audit_rewards(db: str, acknowledged: int, largest_write: int) -> tuple[int, list[str]]:
    """(ledger rows, problems): Q = replay, complete rows, whole receipts, nothing acknowledged lost."""
    problems = verify(db)
    with MemoryBank(db, create=False) as bank:
        c = bank.conn
        rows = c.execute("SELECT count(*) FROM rewards").fetchone()[0]
        incomplete = c.execute("SELECT count(*) FROM rewards WHERE kind = 'reward' AND (reward IS NULL OR alpha IS "
                               "NULL OR q_before IS NULL OR q_after IS NULL OR created_at IS NULL)").fetchone()[0]
        visits = c.execute("SELECT coalesce(sum(visits), 0) FROM memories").fetchone()[0]
        partial = c.execute("SELECT count(*) FROM (SELECT r.retrieval_id, count(*) AS n FROM rewards r "
                            "WHERE r.retrieval_id IS NOT NULL GROUP BY r.retrieval_id) g WHERE g.n != (SELECT "
                            "count(*) FROM retrieval_candidates c WHERE c.retrieval_id = g.retrieval_id AND "
                            "c.selected_rank IS NOT NULL)").fetchone()[0]
        empty = c.execute("SELECT count(*) FROM retrievals r WHERE NOT EXISTS (SELECT 1 FROM retrieval_candidates c "
                          "WHERE c.retrieval_id = r.id)").fetchone()[0]
        ranks = c.execute("SELECT count(*) FROM (SELECT retrieval_id, count(selected_rank) AS n, "
                          "max(selected_rank) AS top FROM retrieval_candidates GROUP BY retrieval_id) "
                          "WHERE n = 0 OR top != n - 1").fetchone()[0]
    if incomplete:
        problems.append(f"{incomplete} ledger rows are incomplete")
    if visits != rows:
        problems.append(f"visits add up to {visits}, the ledger has {rows} reward rows")
    if partial:
        problems.append(f"{partial} receipts were rewarded for only some of their selected memories")
    if empty or ranks:
        problems.append(f"{empty + ranks} receipts are missing candidates or selections")
    if rows < acknowledged:
        problems.append(f"{rows} ledger rows, but {acknowledged} were acknowledged as committed (lost)")
    if acknowledged >= 0 and rows > acknowledged + largest_write:
        problems.append(f"{rows} ledger rows, more than the {acknowledged} acknowledged plus one write")
    return rows, problems


def audit_run(db: str) -> list[str]:
    """A killed run's bank: verified, and every recorded episode belongs to a committed batch."""
    problems = verify(db)
    with MemoryBank(db, create=False) as bank:
        orphans = 0 if not runs.has_runs(bank) else bank.conn.execute(  # killed before the run was recorded: none
            "SELECT count(*) FROM episodes e WHERE NOT EXISTS (SELECT 1 FROM run_batches b WHERE b.run_id = e.run_id "
            "AND b.phase = e.phase AND b.split = e.split AND b.epoch = e.epoch AND b.batch = e.batch)").fetchone()[0]
    if orphans:
        problems.append(f"{orphans} episodes without their batch marker (half-written batch)")
    return problems


# -- the three experiments ----------------------------------------------------------------------

@dataclass
class KindReport:
    """Repetitions of one experiment."""

    kind: str
    kills: int = 0
    finished_before_kill: int = 0
    final_state: str = ""
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def record(self, rep: int, kill: Kill, problems: list[str], outcome: str) -> None:
        """Count one repetition: a kill (or a writer that finished first), its problems, what it left."""
        self.kills += not kill.exited_before_kill
        self.finished_before_kill += kill.exited_before_kill
        self.problems += [f"{self.kind} kill {rep + 1}: {p}" for p in problems]
        self.notes.append(f"kill {rep + 1} at +{kill.delay:.2f}s: {outcome}")


def crash_ingest(workdir: Path, repeats: int, rng: random.Random) -> KindReport:
    """Kill an API writer (mini-batches of 25) or `memrl ingest --jsonl` (one 1000-line file) at random."""
    db = str(workdir / "ingest.db")
    report = KindReport("ingest")
    with MemoryBank(db, SPEC):
        pass
    rep = -1
    while report.kills < repeats and rep < 3 * repeats:  # a writer that finished first is not a kill: retry
        rep += 1
        with MemoryBank(db, create=False) as bank:
            before = bank.count()
        if rep % 2 == 0:
            kill = run_and_kill([sys.executable, "-m", "benchmarks.perf.crash", "--writer", "ingest", db],
                                rng.uniform(0.0, 1.0))
        else:
            path = workdir / "bulk.jsonl"
            path.write_text("".join(json.dumps(record(i)) + "\n" for i in range(before, before + FILE_LINES)))
            kill = run_and_kill(memrl_command("ingest", "--jsonl", str(path), "--db", db), rng.uniform(0.0, 0.8),
                                ready=lambda: True)
            kill.acknowledged = before + (FILE_LINES if kill.exited_before_kill else 0)  # else: 0 or all
        count, problems = audit_ingest(db, before, kill.acknowledged, BATCH if rep % 2 == 0 else FILE_LINES)
        report.record(rep, kill, problems, f"{count - before} memories added")
        report.final_state = f"{count} memories"
    return report


def seed_reward_bank(db: str) -> None:
    """A bank with the memories the reward writers reward."""
    with MemoryBank(db, SPEC) as bank:
        bank.ingest_many([record(i) for i in range(SEED_MEMORIES)])


def crash_reward(workdir: Path, repeats: int, rng: random.Random) -> KindReport:
    """Kill an API reward writer or `memrl reward --jsonl` (one 500-reward file) at random."""
    db = str(workdir / "reward.db")
    report = KindReport("reward")
    seed_reward_bank(db)
    rep = -1
    while report.kills < repeats and rep < 3 * repeats:  # a writer that finished first is not a kill: retry
        rep += 1
        with MemoryBank(db, create=False) as bank:
            before = bank.conn.execute("SELECT count(*) FROM rewards").fetchone()[0]
        if rep % 2 == 0:
            kill = run_and_kill([sys.executable, "-m", "benchmarks.perf.crash", "--writer", "reward", db],
                                rng.uniform(0.0, 1.0))
            largest = REWARDS
        else:
            path = workdir / "rewards.jsonl"
            path.write_text("".join(json.dumps({"memory_ids": [1 + (before + i) % SEED_MEMORIES],
                                                "reward": 1 if i % 3 else -1}) + "\n" for i in range(FILE_REWARDS)))
            kill = run_and_kill(memrl_command("reward", "--jsonl", str(path), "--db", db), rng.uniform(0.0, 0.7),
                                ready=lambda: True)
            kill.acknowledged = before + (FILE_REWARDS if kill.exited_before_kill else 0)
            largest = FILE_REWARDS
            with MemoryBank(db, create=False) as bank:
                after = bank.conn.execute("SELECT count(*) FROM rewards").fetchone()[0]
            if after - before not in (0, FILE_REWARDS):
                report.problems.append(f"reward kill {rep + 1}: {after - before} of {FILE_REWARDS} rewards applied")
        rows, problems = audit_rewards(db, kill.acknowledged, largest)
        report.record(rep, kill, problems, f"{rows - before} ledger rows added")
        report.final_state = f"{rows} ledger rows"
    return report


def bench_command(runs_dir: Path, base_url: str, rooms: int, epochs: int, *extra: str) -> list[str]:
    """`memrl bench` on the toy benchmark (mini-batches of 2, in-process episodes)."""
    return memrl_command("bench", TOY, "--epochs", str(epochs), "--batch-size", "2", "--threshold", "0.3",
                         "--option", f"rooms={rooms}", "--option", "delay=0.1", "--workers", "0", "--runs-dir",
                         str(runs_dir), "--base-url", base_url, "--model", "scripted", "--json", *extra)


def uninterrupted(runs_dir: Path, base_url: str, rooms: int, epochs: int) -> tuple[dict[str, Any], float]:
    """The reference: the same run, uninterrupted (in this process); its metrics and its loop's duration."""
    from memrl_bench.framework.config import BenchConfig
    from memrl_bench.framework.harness import run_benchmark
    from memrl_bench.framework.llm import LLMSettings

    config = BenchConfig(benchmark=TOY, epochs=epochs, batch_size=2, threshold=0.3,
                         options={"rooms": rooms, "delay": 0.1})
    summary = run_benchmark(config, LLMSettings(model="scripted", base_url=base_url, api_key="sk-not-a-real-key"),
                            runs_dir=str(runs_dir), workers=0)
    run_dir = runs_dir / summary["run_id"]  # the loop runs from config.json's writing to summary.json's
    loop = (run_dir / "summary.json").stat().st_mtime - (run_dir / "config.json").stat().st_mtime
    return json.loads(json.dumps({k: summary[k] for k in METRICS})), loop


def crash_bench(workdir: Path, repeats: int, rng: random.Random, rooms: int = 6, epochs: int = 3) -> KindReport:
    """Kill `memrl bench` at a random point of its run, resume it, compare with an uninterrupted run."""
    from benchmarks.testing.chat_server import ScriptedChatServer
    from benchmarks.testing.toy_benchmark import responder

    report = KindReport("bench")
    batches = epochs * -(-rooms // 2)
    with ScriptedChatServer(responder) as server:
        expected, duration = uninterrupted(workdir / "baseline", server.base_url, rooms, epochs)
        for rep in range(repeats):
            runs_dir = workdir / f"killed-{rep}"
            kill = run_and_kill(bench_command(runs_dir, server.base_url, rooms, epochs), rng.uniform(0.0, duration),
                                ready=lambda: any(runs_dir.glob("*/config.json")))
            run_dir = next(runs_dir.glob("*/config.json")).parent
            db = str(run_dir / "bank.db")
            with MemoryBank(db, create=False) as bank:
                committed = bank.conn.execute("SELECT count(*) FROM run_batches").fetchone()[0] \
                    if runs.has_runs(bank) else 0  # killed before the run was recorded
            problems = audit_run(db)
            resumed = subprocess.run(bench_command(runs_dir, server.base_url, rooms, epochs, "--resume", str(run_dir)),
                                     cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600)
            if resumed.returncode != 0:
                problems.append(f"resume failed: {resumed.stderr.strip()[-300:]}")
            else:
                got = {k: json.loads(resumed.stdout)[k] for k in METRICS}
                if got != expected:
                    problems.append(f"resumed metrics {json.dumps(got)} differ from {json.dumps(expected)}")
                problems += audit_run(db)
            report.record(rep, kill, problems, f"{committed} of {batches} batches committed")
            report.final_state = f"{rep + 1} runs resumed to the uninterrupted run's metrics" \
                if not report.problems else ""
    return report


EXPERIMENTS = {"ingest": crash_ingest, "reward": crash_reward, "bench": crash_bench}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20, help="kills per experiment")
    parser.add_argument("--kinds", default="ingest,reward,bench")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--writer", nargs=2, metavar=("KIND", "DB"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.writer:
        {"ingest": writer_ingest, "reward": writer_reward}[args.writer[0]](args.writer[1])
        return
    rng = random.Random(args.seed)
    reports = []
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kinds.split(","):
            reports.append(EXPERIMENTS[kind](Path(tmp), args.repeats, rng))
    ok = not any(r.problems for r in reports)
    if args.json:
        print(json.dumps({"ok": ok, "seconds": round(time.time() - started, 1),
                          "experiments": [asdict(r) for r in reports]}))
    else:
        for r in reports:
            print(f"{r.kind}: {r.kills} kill -9 survived ({r.finished_before_kill} writers finished before the "
                  f"signal); bank: {r.final_state}; {len(r.problems)} problems")
            for p in r.problems:
                print(f"  {p}")
        print(f"{'all intact' if ok else 'FAILED'} in {time.time() - started:.0f} s")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
