"""Helpers for the server tests: run `memrl mcp --host --port` / `memrl proxy` as real subprocesses, and read a
bank's learned state to compare two banks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from conftest import cli_env
from memrl_cli.bank import MemoryBank

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextmanager
def serving(*args: str, env: dict[str, str] | None = None, log: list[str] | None = None) -> Iterator[str]:
    """Start `memrl ARGS` (a server that binds port 0) and yield its base URL once it listens; its stderr
    lines are appended to `log` as they come."""
    process = subprocess.Popen([sys.executable, "-m", "memrl_cli", *args], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env or cli_env())
    found: list[str] = []
    lines: list[str] = [] if log is None else log
    ready = threading.Event()

    def read() -> None:  # keep draining stderr so the server never blocks on it
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            match = re.search(r"listening on (http://\S+)", line)
            if match and not found:
                found.append(match.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        ready.wait(60)
        assert found, f"the server did not start: {''.join(lines)}"
        yield found[0]
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def learned_state(db: str) -> dict[str, list[tuple]]:
    """Memories, receipts and the reward ledger, without timestamps: what two banks fed the same
    operations must share."""
    with MemoryBank(db, create=False) as bank:
        def rows(sql: str) -> list[tuple]:
            return [tuple(r) for r in bank.conn.execute(sql).fetchall()]
        return {
            "memories": rows("SELECT id, intent, experience, outcome, task_id, source, q, q_init, visits, metadata "
                             "FROM memories ORDER BY id"),
            "retrievals": rows("SELECT id, query, params, sim_mean, sim_std, explored FROM retrievals ORDER BY id"),
            "candidates": rows("SELECT retrieval_id, memory_id, recall_rank, similarity, q, z_sim, z_q, score, "
                               "selected_rank FROM retrieval_candidates ORDER BY retrieval_id, memory_id"),
            "rewards": rows("SELECT id, retrieval_id, memory_id, kind, reward, alpha, q_floor, q_before, q_after, source "
                            "FROM rewards ORDER BY id"),
        }


def seed(db: str) -> None:
    """Two memories for nearby tasks: a bad one closer to the task text, a good one a bit further."""
    with MemoryBank(db) as bank:
        bank.ingest("heat an egg in the microwave", "REFLECTION: the stove burnt it; the egg exploded", "failure")
        bank.ingest("warm up an egg and put it on the table", "SCRIPT: 1. take egg 2. microwave 30 s 3. put on table",
                    "success")
