"""The Store's queries of the harness's tables (`schema.RUNS`: runs, episodes, run_batches), which the
harness creates when a run first opens the bank (`memrl_cli.ops.runs`). Mixed into `memrl_cli.store.base.Store`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

RUN_FIELDS = ("id", "benchmark", "method", "config", "models", "seed", "code_version", "status", "created_at")


class RunRecords:
    """Rows of benchmark runs: the run, its committed mini-batches and episodes, and what its receipts show."""

    conn: Any

    def insert_run(self, run_id: str, benchmark: str, method: str, config: str, models: str, seed: int | None,
                   code_version: str, stamp: str) -> None:
        """Inside a write: a new run row (config and models as JSON text)."""
        self.conn.execute("INSERT INTO runs (id, benchmark, method, config, models, seed, code_version, created_at, "
                          "updated_at) VALUES (?,?,?,?,?,?,?,?,?)",
                          (run_id, benchmark, method, config, models, seed, code_version, stamp, stamp))

    def run_record(self, run_id: str) -> dict[str, Any] | None:
        """A run's row (RUN_FIELDS; config and models as JSON text), or None."""
        row = self.conn.execute(f"SELECT {', '.join(RUN_FIELDS)} FROM runs WHERE id = ?", (run_id,)).fetchone()
        return None if row is None else dict(zip(RUN_FIELDS, row))

    def set_run_status(self, run_id: str, status: str, stamp: str) -> None:
        """Inside a write: a run's status."""
        self.conn.execute("UPDATE runs SET status = ?, updated_at = ? WHERE id = ?", (status, stamp, run_id))

    def committed_batches(self, run_id: str) -> set[tuple[str, str, int, int]]:
        """(phase, split, epoch, batch) of a run's committed mini-batches."""
        return {(p, s, int(e), int(b)) for p, s, e, b in self.conn.execute(
            "SELECT phase, split, epoch, batch FROM run_batches WHERE run_id = ?", (run_id,))}

    def insert_batch(self, run_id: str, marker: tuple[str, str, int, int], fields: Sequence[str],
                     episodes: Sequence[tuple[Any, ...]], stamp: str) -> None:
        """Inside a write: a mini-batch's episode rows (values in `fields` order) and its completion marker."""
        self.conn.executemany(f"INSERT INTO episodes (run_id, {', '.join(fields)}, created_at) "
                              f"VALUES (?, {', '.join('?' * len(fields))}, ?)",
                              [(run_id, *row, stamp) for row in episodes])
        self.conn.execute("INSERT INTO run_batches (run_id, phase, split, epoch, batch, completed_at) "
                          "VALUES (?,?,?,?,?,?)", (run_id, *marker, stamp))
        self.conn.execute("UPDATE runs SET updated_at = ? WHERE id = ?", (stamp, run_id))

    def episode_rows(self, run_id: str, fields: Sequence[str]) -> list[dict[str, Any]]:
        """A run's committed episodes in play order (`fields`, as stored)."""
        return [dict(zip(fields, row)) for row in self.conn.execute(
            f"SELECT {', '.join(fields)} FROM episodes WHERE run_id = ? ORDER BY id", (run_id,))]

    def rewarded_selections(self, run_id: str) -> list[tuple[str, int]]:
        """(task id, memory id) of each memory whose selection for one of the run's training episodes was
        rewarded positively, each pair once."""
        return [(t, int(m)) for t, m in self.conn.execute(
            "SELECT DISTINCT e.task_id, w.memory_id FROM episodes e JOIN rewards w ON w.retrieval_id = e.retrieval_id "
            "WHERE e.run_id = ? AND e.phase = 'train' AND w.kind = 'reward' AND w.reward > 0", (run_id,))]

    def training_receipts(self, run_id: str) -> list[tuple[int, str, int | None, int | None]]:
        """(retrieval id, its time, a candidate memory id or None, its selected rank or None) for the receipts
        of a run's training episodes, a row per candidate."""
        return [tuple(r) for r in self.conn.execute(  # type: ignore[misc]
            "SELECT r.id, r.created_at, c.memory_id, c.selected_rank FROM episodes e "
            "JOIN retrievals r ON r.id = e.retrieval_id "
            "LEFT JOIN retrieval_candidates c ON c.retrieval_id = r.id "
            "WHERE e.run_id = ? AND e.phase = 'train'", (run_id,))]

    def selected_q(self, run_id: str) -> list[tuple[int, bool, float]]:
        """(epoch, the episode's success, the memory's Q when it was retrieved) for every memory selected for
        one of a run's training episodes (the receipts record each candidate's Q at retrieval time)."""
        return [(int(r[0]), bool(r[1]), float(r[2])) for r in self.conn.execute(
            "SELECT e.epoch, e.success, c.q FROM episodes e JOIN retrieval_candidates c ON c.retrieval_id = e.retrieval_id "
            "WHERE e.run_id = ? AND e.phase = 'train' AND c.selected_rank IS NOT NULL ORDER BY e.epoch", (run_id,))]

    def training_episodes(self, run_id: str) -> list[tuple[str, int, int, int | None, int | None]]:
        """(task id, epoch, batch, retrieval id, new memory id) of a run's training episodes."""
        return [tuple(r) for r in self.conn.execute(  # type: ignore[misc]
            "SELECT task_id, epoch, batch, retrieval_id, new_memory_id FROM episodes WHERE run_id = ? "
            "AND phase = 'train'", (run_id,))]
