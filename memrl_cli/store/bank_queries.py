"""The Store's statements for `MemoryBank`'s parts (`memrl_cli.bank`): counting and listing memories, the
vectors Phase A scans, a retrieval's receipt, the checks and writes of a reward, the query cache. Writes
run inside the caller's write transaction. Mixed into `memrl_cli.store.base.Store` (the SQL both engines
share)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memrl_cli.store.views import CHUNK

VISIBLE = "(quarantined_at IS NULL AND forgotten_at IS NULL)"  # a memory retrieval may return
ERASED = "content_hash LIKE 'erased:%'"  # a memory `memrl forget` erased: no text, a zero vector, in no index


class BankQueries:
    """What the bank's parts read and write, each one named statement (or a few, in chunks)."""

    conn: Any
    _lock_tasks = ""  # a statement that makes the current write the only writer of task rows (`_writing_tasks`)

    # -- memories --------------------------------------------------------------------
    def has_memory(self) -> bool:
        """Whether the bank holds a memory (cheaper than `memory_count()`)."""
        return self.conn.execute("SELECT 1 FROM memories LIMIT 1").fetchone() is not None

    def memory_count(self) -> int:
        """Number of memories (quarantined and forgotten ones included)."""
        return int(self.conn.execute("SELECT count(*) FROM memories").fetchone()[0])

    def memory_ids(self) -> list[int]:
        """Every memory's id but the erased ones' (which have no vector), ascending."""
        return [int(r[0]) for r in self.conn.execute(f"SELECT id FROM memories WHERE NOT {ERASED} ORDER BY id")]

    def erased_count(self) -> int:
        """How many memories `memrl forget` erased (kept for their ledger, without text or vector)."""
        return int(self.conn.execute(f"SELECT count(*) FROM memories WHERE {ERASED}").fetchone()[0])

    def memories_after(self, last_id: int) -> list[tuple[int, Any]]:
        """(id, stored vector) of the memories with an id above `last_id`, ascending: what a matrix
        index that holds the bank up to `last_id` lacks."""
        return self.conn.execute("SELECT id, embedding FROM memories WHERE id > ? ORDER BY id", (last_id,)).fetchall()

    def ids_where(self, conditions: Sequence[str], args: Sequence[Any]) -> list[int]:
        """Ids of the memories meeting every condition (`Store.filter_condition`)."""
        return [r[0] for r in self.conn.execute(f"SELECT id FROM memories WHERE {' AND '.join(conditions)}", args)]

    def quarantined_ids(self) -> list[int]:
        """Ids of the quarantined memories, ascending."""
        return [r[0] for r in self.conn.execute("SELECT id FROM memories WHERE quarantined_at IS NOT NULL ORDER BY id")]

    def hidden_ids(self) -> list[int]:
        """Ids of the memories no retrieval returns (quarantined or forgotten), ascending."""
        return [r[0] for r in self.conn.execute(f"SELECT id FROM memories WHERE NOT {VISIBLE} ORDER BY id")]

    def id_with_content(self, digest: str) -> int | None:
        """The id of the memory holding this content hash, or None."""
        row = self.conn.execute("SELECT id FROM memories WHERE content_hash = ?", (digest,)).fetchone()
        return None if row is None else int(row[0])

    def content_elsewhere(self, digest: str, memory_id: int) -> bool:
        """Whether a memory other than `memory_id` holds this content hash."""
        return self.conn.execute("SELECT 1 FROM memories WHERE content_hash = ? AND id <> ?",
                                 (digest, memory_id)).fetchone() is not None

    def set_experience(self, memory_id: int, experience: str, digest: str, stamp: str) -> None:
        """Revise a memory's experience text in place (its content hash with it)."""
        self.conn.execute("UPDATE memories SET experience = ?, content_hash = ?, updated_at = ? WHERE id = ?",
                          (experience, digest, stamp, memory_id))

    # -- receipts ----------------------------------------------------------------------
    def insert_receipt(self, query: str, params: str, sim_mean: float | None, sim_std: float | None, explored: bool,
                       stamp: str, query_vector: bytes | None, task_id: str | None = None,
                       scope: str | None = None) -> int:
        """A new retrieval's receipt row (with the caller's task id and scope, if any); its id."""
        row = self.conn.execute("INSERT INTO retrievals (query, params, sim_mean, sim_std, explored, created_at, "
                                "query_vector, task_id, scope) VALUES (?,?,?,?,?,?,?,?,?) RETURNING id",
                                (query, params, sim_mean, sim_std, int(explored), stamp, query_vector, task_id,
                                 scope)).fetchone()
        return int(row[0])

    def insert_candidates(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """A receipt's candidates: (retrieval_id, memory_id, recall_rank, similarity, q, z_sim, z_q, score,
        selected_rank) each."""
        self.conn.executemany("INSERT INTO retrieval_candidates (retrieval_id, memory_id, recall_rank, similarity, q, "
                              "z_sim, z_q, score, selected_rank) VALUES (?,?,?,?,?,?,?,?,?)", list(rows))

    def mark_used(self, memory_ids: Sequence[int], stamp: str) -> None:
        """Set the memories' last use (a retrieval selected them)."""
        self.conn.executemany("UPDATE memories SET last_used_at = ? WHERE id = ?", [(stamp, mid) for mid in memory_ids])

    def has_receipt(self, retrieval_id: int) -> bool:
        """Whether a retrieval's receipt exists."""
        return self.conn.execute("SELECT 1 FROM retrievals WHERE id = ?", (retrieval_id,)).fetchone() is not None

    def receipt_rewarded(self, retrieval_id: int) -> bool:
        """Whether a reward of this retrieval is in the ledger."""
        return self.conn.execute("SELECT 1 FROM rewards WHERE retrieval_id = ? LIMIT 1",
                                 (retrieval_id,)).fetchone() is not None

    def receipt_scope(self, retrieval_id: int) -> tuple[bool, str | None]:
        """(whether the receipt exists, the scope it was retrieved in)."""
        row = self.conn.execute("SELECT scope FROM retrievals WHERE id = ?", (retrieval_id,)).fetchone()
        return (False, None) if row is None else (True, row[0])

    def task_receipts(self, task_id: str, scope: str | None, any_scope: bool) -> list[tuple[int, str | None]]:
        """(id, scope) of the newest receipt of a task id in each scope it was retrieved in, newest first; only
        in `scope` (None: without a scope) unless `any_scope`."""
        where, args = "task_id = ?", [task_id]
        if not any_scope:
            where += " AND scope IS NULL" if scope is None else " AND scope = ?"
            args += [] if scope is None else [scope]
        return [(int(r[0]), r[1]) for r in self.conn.execute(
            f"SELECT max(id), scope FROM retrievals WHERE {where} GROUP BY scope ORDER BY max(id) DESC", args)]

    def selected_memories(self, retrieval_id: int) -> list[tuple[Any, ...]]:
        """(id, intent, experience, outcome, similarity, q, score, forgotten_at) of the memories a receipt selected,
        in selection order, with their texts as they are now."""
        return self.conn.execute(
            "SELECT m.id, m.intent, m.experience, m.outcome, c.similarity, c.q, c.score, m.forgotten_at "
            "FROM retrieval_candidates c JOIN memories m ON m.id = c.memory_id WHERE c.retrieval_id = ? AND "
            "c.selected_rank IS NOT NULL ORDER BY c.selected_rank", (retrieval_id,)).fetchall()

    # -- the tasks a server keeps open (the proxy's: which receipt a task id, a conversation, a response is) -----------
    def open_tasks(self, keys: Sequence[str], since: str) -> list[tuple[str, int, int]]:
        """(key, retrieval_id, calls) of the tasks under these keys that are open (not ended by a reward) and
        changed at or after `since`."""
        if not keys:
            return []
        return [(r[0], int(r[1]), int(r[2])) for r in self.conn.execute(
            f"SELECT key, retrieval_id, calls FROM tasks WHERE key IN ({','.join('?' * len(keys))}) AND ended_at IS "
            "NULL AND updated_at >= ?", [*keys, since])]

    def _writing_tasks(self) -> None:
        """Inside a write, before its first change of task rows: wait to be their only writer. Every write
        changes task rows after the receipts and memories it locks, so writers never deadlock over them (a
        no-op on SQLite, whose writers are already serialised)."""
        if self._lock_tasks:
            self.conn.execute(self._lock_tasks)

    def open_task(self, key: str, retrieval_id: int, calls: int, stamp: str) -> None:
        """Inside a write: `key` is now the task of this receipt (a new task under an old key replaces it)."""
        self._writing_tasks()
        self.conn.execute("INSERT INTO tasks (key, retrieval_id, calls, updated_at) VALUES (?, ?, ?, ?) ON CONFLICT "
                          "(key) DO UPDATE SET retrieval_id = excluded.retrieval_id, calls = excluded.calls, "
                          "updated_at = excluded.updated_at, ended_at = NULL", (key, retrieval_id, calls, stamp))

    def touch_tasks(self, rows: Sequence[tuple[str, int, int]], stamp: str) -> None:
        """Inside a write: for each (key, retrieval_id, calls), the task under `key` (added when missing) has had
        a call of `calls` messages now; a key that names another receipt's task by now is left alone."""
        self._writing_tasks()
        self.conn.executemany(
            "INSERT INTO tasks (key, retrieval_id, calls, updated_at) VALUES (?, ?, ?, ?) ON CONFLICT (key) DO UPDATE "
            "SET calls = CASE WHEN excluded.calls > tasks.calls THEN excluded.calls ELSE tasks.calls END, "
            "updated_at = excluded.updated_at WHERE tasks.retrieval_id = excluded.retrieval_id",
            [(key, rid, calls, stamp) for key, rid, calls in rows])

    def end_tasks(self, retrieval_ids: Sequence[int], stamp: str) -> None:
        """Inside a write: the tasks of these receipts are over (rewarded): their keys open new tasks."""
        if not retrieval_ids:
            return
        self._writing_tasks()
        self.conn.executemany("UPDATE tasks SET ended_at = ? WHERE retrieval_id = ? AND ended_at IS NULL",
                              [(stamp, rid) for rid in retrieval_ids])

    def task_ended(self, retrieval_id: int) -> bool:
        """Whether the task of this receipt is over: a reward of the receipt (or of its task) came."""
        return self.conn.execute(
            "SELECT 1 FROM tasks WHERE retrieval_id = ? AND ended_at IS NOT NULL UNION ALL SELECT 1 FROM rewards "
            "WHERE retrieval_id = ? LIMIT 1", (retrieval_id, retrieval_id)).fetchone() is not None

    def prune_tasks(self, before: str) -> None:
        """Inside a write: forget the tasks unchanged since before `before` (expired)."""
        self._writing_tasks()
        self.conn.execute("DELETE FROM tasks WHERE updated_at < ?", (before,))

    def selected_ids(self, retrieval_id: int) -> list[int]:
        """The memories a retrieval selected, in selection order."""
        return [row[0] for row in self.conn.execute(
            "SELECT memory_id FROM retrieval_candidates WHERE retrieval_id = ? AND selected_rank IS NOT NULL "
            "ORDER BY selected_rank", (retrieval_id,))]

    def rewarded_queries(self, memory_ids: Sequence[int]) -> list[tuple[int, float, Any]]:
        """(memory id, reward, the retrieval's query vector) of every reward of these memories through a
        receipt that kept its query's vector (`memrl-conditioned`)."""
        rows: list[tuple[int, float, Any]] = []
        for start in range(0, len(memory_ids), CHUNK):
            chunk = list(memory_ids[start:start + CHUNK])
            rows += self.conn.execute(
                "SELECT w.memory_id, w.reward, r.query_vector FROM rewards w JOIN retrievals r ON r.id = w.retrieval_id "
                f"WHERE w.kind = 'reward' AND r.query_vector IS NOT NULL AND w.memory_id IN ({','.join('?' * len(chunk))})",
                chunk).fetchall()
        return rows

    # -- the query cache -------------------------------------------------------------
    def cached_query(self, key: str) -> Any:
        """The vector stored under a query's cache key, or None."""
        row = self.conn.execute("SELECT vector FROM query_cache WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def cache_query(self, key: str, vector: bytes, stamp: str) -> None:
        """Remember a query's vector under its cache key (refreshing its time when it is there)."""
        self.conn.execute("INSERT INTO query_cache (key, vector, created_at) VALUES (?, ?, ?) ON CONFLICT (key) "
                          "DO UPDATE SET created_at = excluded.created_at", (key, vector, stamp))
