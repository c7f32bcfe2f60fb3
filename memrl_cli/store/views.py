"""The Store's read-only queries for the operations over a bank: what `inspect`, `verify`, `export`,
the learning report and the harness's baselines read. Each returns plain values or dicts named by
column; none writes. Mixed into `memrl_cli.store.base.Store` (the SQL both engines share)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

MEMORY_FIELDS = ("id", "intent", "experience", "outcome", "task_id", "source", "q", "q_init", "visits",
                 "created_at", "updated_at", "last_used_at", "metadata", "quarantined_at", "scope", "forgotten_at",
                 "replaced_by")
LEDGER_FIELDS = ("id", "retrieval_id", "kind", "reward", "alpha", "q_floor", "q_before", "q_after", "created_at",
                 "source")
QUARANTINE_FIELDS = ("action", "reason", "actor", "created_at")
CHUNK = 500  # ids per `IN (…)` list
# What `memrl memories` lists of a memory, and the orders it lists them in.
LISTED_FIELDS = ("id", "outcome", "q", "visits", "scope", "source", "task_id", "intent", "experience", "created_at",
                 "quarantined_at", "forgotten_at", "replaced_by")
MEMORY_ORDERS = {"newest": "id DESC", "oldest": "id", "q": "q DESC, id DESC", "visits": "visits DESC, id DESC"}
RECEIPT_FIELDS = ("id", "task_id", "scope", "query", "created_at", "explored")


def dict_rows(cursor: Any) -> list[dict[str, Any]]:
    """A cursor's rows as dicts by column name."""
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


class BankViews:
    """Read-only queries over memories, receipts, the ledger and the quarantine log."""

    conn: Any

    def matches(self, column: str, patterns: Sequence[str | None]) -> tuple[str, list[str]]:
        raise NotImplementedError

    # -- memories ------------------------------------------------------------------

    def top_memories(self, n: int, scopes: Sequence[str | None] = ()) -> list[dict[str, Any]]:
        """The `n` memories with the highest Q (ties: most visited, then oldest), every field; with `scopes`,
        only those whose scope matches one (`matches`)."""
        where, args = self.matches("scope", scopes) if scopes else ("", [])
        return dict_rows(self.conn.execute(f"SELECT {', '.join(MEMORY_FIELDS)} FROM memories "
                                           f"{'WHERE ' + where if where else ''} ORDER BY q DESC, visits DESC, id "
                                           "LIMIT ?", (*args, n)))

    def find_memories(self, conditions: Sequence[tuple[str, Any]], order: str, limit: int) -> list[dict[str, Any]]:
        """Memories (LISTED_FIELDS) that pass every condition, in `order` (a key of MEMORY_ORDERS), at most
        `limit`. A condition is (name, value): `outcome` (one of a list), `source`/`scope` (patterns,
        `matches`), `q_min`/`q_max` (inclusive), `text` (a case-insensitive substring of the intent or
        the experience), `forgotten` (True: only forgotten memories; False: none of them)."""
        where: list[str] = []
        args: list[Any] = []
        for name, value in conditions:
            if name == "outcome":
                where.append(f"outcome IN ({','.join('?' * len(value))})")
                args += list(value)
            elif name in ("source", "scope"):
                condition, more = self.matches(name, value)
                where.append(condition)
                args += more
            elif name in ("q_min", "q_max"):
                where.append("q >= ?" if name == "q_min" else "q <= ?")
                args.append(value)
            elif name == "text":
                escaped = "%" + value.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
                where.append("(lower(intent) LIKE ? ESCAPE '\\' OR lower(experience) LIKE ? ESCAPE '\\')")
                args += [escaped, escaped]
            elif name == "forgotten":
                where.append("forgotten_at IS NOT NULL" if value else "forgotten_at IS NULL")
            else:
                raise ValueError(f"not a memory condition: {name!r}")
        sql = (f"SELECT {', '.join(LISTED_FIELDS)} FROM memories" + (f" WHERE {' AND '.join(where)}" if where else "")
               + f" ORDER BY {MEMORY_ORDERS[order]} LIMIT ?")
        return dict_rows(self.conn.execute(sql, [*args, limit]))

    def version_links(self, memory_id: int) -> tuple[int | None, int | None]:
        """(the memory an edit replaced with this one, the memory an edit replaced this one with)."""
        before = self.conn.execute("SELECT id FROM memories WHERE replaced_by = ?", (memory_id,)).fetchone()
        after = self.conn.execute("SELECT replaced_by FROM memories WHERE id = ?", (memory_id,)).fetchone()
        return (None if before is None else int(before[0]),
                None if after is None or after[0] is None else int(after[0]))

    def memory_record(self, memory_id: int) -> dict[str, Any] | None:
        """One memory's every field, or None."""
        rows = dict_rows(self.conn.execute(f"SELECT {', '.join(MEMORY_FIELDS)} FROM memories WHERE id = ?",
                                           (memory_id,)))
        return rows[0] if rows else None

    def memories_in_order(self, vectors: bool = False) -> Iterator[tuple[Any, ...]]:
        """Every memory by id: (id, intent, experience, outcome, task_id, source, q, q_init, visits, created_at,
        updated_at, last_used_at, metadata, scope, forgotten_at[, stored vector])."""
        columns = ", ".join(MEMORY_FIELDS[:13]) + ", scope, forgotten_at" + (", embedding" if vectors else "")
        yield from self.conn.execute(f"SELECT {columns} FROM memories ORDER BY id")

    def q_values(self) -> np.ndarray:
        """Every memory's Q."""
        return np.array([r[0] for r in self.conn.execute("SELECT q FROM memories")], dtype=np.float64)

    def q_and_initial_q(self) -> list[tuple[int, float, float]]:
        """(id, q, q_init) of every memory."""
        return [(int(i), q, q_init) for i, q, q_init in self.conn.execute("SELECT id, q, q_init FROM memories")]

    def forgotten_count(self) -> int:
        """How many memories are forgotten (`memrl forget`, and the versions `memrl edit` replaced)."""
        return int(self.conn.execute("SELECT count(*) FROM memories WHERE forgotten_at IS NOT NULL").fetchone()[0])

    def outcome_counts(self) -> dict[str, int]:
        """Memories per outcome."""
        return {k: int(v) for k, v in self.conn.execute("SELECT outcome, count(*) FROM memories GROUP BY outcome")}

    def never_selected(self) -> int:
        """How many memories no retrieval has selected."""
        return int(self.conn.execute("SELECT count(*) FROM memories m WHERE NOT EXISTS (SELECT 1 FROM "
                                     "retrieval_candidates c WHERE c.memory_id = m.id AND c.selected_rank IS NOT "
                                     "NULL)").fetchone()[0])

    def recent_task_memories(self, task_id: str, limit: int) -> list[tuple[int, str, str, str, float]]:
        """(id, intent, experience, outcome, q) of a task's newest `limit` memories, newest first."""
        return [tuple(r) for r in self.conn.execute(  # type: ignore[misc]
            "SELECT id, intent, experience, outcome, q FROM memories WHERE task_id = ? ORDER BY id DESC LIMIT ?",
            (task_id, limit))]

    def experiences(self) -> dict[int, str]:
        """Every memory's experience text, by id."""
        return dict(self.conn.execute("SELECT id, experience FROM memories").fetchall())

    def created_at(self, memory_ids: Sequence[int]) -> dict[int, str]:
        """When each of these memories was stored."""
        found: dict[int, str] = {}
        ordered = sorted(memory_ids)
        for start in range(0, len(ordered), CHUNK):
            chunk = ordered[start:start + CHUNK]
            found.update(self.conn.execute(f"SELECT id, created_at FROM memories WHERE id IN "
                                           f"({','.join('?' * len(chunk))})", chunk).fetchall())
        return found

    # -- the ledger and the quarantine log ----------------------------------------

    def memory_ledger(self, memory_id: int) -> list[dict[str, Any]]:
        """A memory's ledger rows, oldest first (LEDGER_FIELDS)."""
        return dict_rows(self.conn.execute(f"SELECT {', '.join(LEDGER_FIELDS)} FROM rewards WHERE memory_id = ? "
                                           "ORDER BY id", (memory_id,)))

    def ledgers(self) -> dict[int, list[dict[str, Any]]]:
        """Every memory's ledger rows, oldest first (LEDGER_FIELDS but the memory id), by memory id."""
        found: dict[int, list[dict[str, Any]]] = {}
        for row in self.conn.execute(f"SELECT memory_id, {', '.join(LEDGER_FIELDS)} FROM rewards ORDER BY id"):
            found.setdefault(row[0], []).append(dict(zip(LEDGER_FIELDS, row[1:])))
        return found

    def ledger_size(self) -> int:
        """Rows in the reward ledger."""
        return int(self.conn.execute("SELECT count(*) FROM rewards").fetchone()[0])

    def memory_quarantine_log(self, memory_id: int) -> list[dict[str, Any]]:
        """A memory's quarantines and releases, oldest first (QUARANTINE_FIELDS)."""
        return dict_rows(self.conn.execute(f"SELECT {', '.join(QUARANTINE_FIELDS)} FROM quarantine_log "
                                           "WHERE memory_id = ? ORDER BY id", (memory_id,)))

    def quarantine_logs(self) -> dict[int, list[dict[str, Any]]]:
        """Every memory's quarantine log (QUARANTINE_FIELDS), oldest first, by memory id."""
        found: dict[int, list[dict[str, Any]]] = {}
        for row in self.conn.execute(f"SELECT memory_id, {', '.join(QUARANTINE_FIELDS)} FROM quarantine_log "
                                     "ORDER BY id"):
            found.setdefault(row[0], []).append(dict(zip(QUARANTINE_FIELDS, row[1:])))
        return found

    def unlogged_quarantines(self) -> int:
        """Memories whose quarantine mark differs from the last action of their quarantine log."""
        return int(self.conn.execute(
            "SELECT count(*) FROM memories m WHERE (m.quarantined_at IS NOT NULL) != (coalesce((SELECT l.action FROM "
            "quarantine_log l WHERE l.memory_id = m.id ORDER BY l.id DESC LIMIT 1), '') = 'quarantine')"
        ).fetchone()[0])

    # -- receipts --------------------------------------------------------------------

    def recent_receipts(self, count: int, unrewarded: bool = False) -> list[dict[str, Any]]:
        """The newest `count` receipts (RECEIPT_FIELDS), newest first; with `unrewarded`, only those that
        selected memories and have no reward yet (the ones a reward is still waiting for)."""
        where = (" WHERE EXISTS (SELECT 1 FROM retrieval_candidates c WHERE c.retrieval_id = r.id AND "
                 "c.selected_rank IS NOT NULL) AND NOT EXISTS (SELECT 1 FROM rewards w WHERE w.retrieval_id = r.id)"
                 if unrewarded else "")
        return dict_rows(self.conn.execute(f"SELECT {', '.join('r.' + f for f in RECEIPT_FIELDS)} FROM retrievals r"
                                           f"{where} ORDER BY r.id DESC LIMIT ?", (count,)))

    def receipts_selected(self, retrieval_ids: Sequence[int]) -> dict[int, list[int]]:
        """The memories each of these receipts selected, in selection order, by receipt id."""
        found: dict[int, list[int]] = {int(i): [] for i in retrieval_ids}
        ordered = sorted(found)
        for start in range(0, len(ordered), CHUNK):
            chunk = ordered[start:start + CHUNK]
            for rid, mid in self.conn.execute(
                    f"SELECT retrieval_id, memory_id FROM retrieval_candidates WHERE retrieval_id IN "
                    f"({','.join('?' * len(chunk))}) AND selected_rank IS NOT NULL ORDER BY retrieval_id, selected_rank",
                    chunk):
                found[int(rid)].append(int(mid))
        return found

    def receipts_rewarded(self, retrieval_ids: Sequence[int]) -> dict[int, tuple[float, str]]:
        """(the latest reward, its time) of each of these receipts that was rewarded."""
        found: dict[int, tuple[float, str]] = {}
        ordered = sorted(set(retrieval_ids))
        for start in range(0, len(ordered), CHUNK):
            chunk = ordered[start:start + CHUNK]
            for rid, reward, stamp in self.conn.execute(
                    f"SELECT retrieval_id, reward, created_at FROM rewards WHERE kind = 'reward' AND retrieval_id IN "
                    f"({','.join('?' * len(chunk))}) ORDER BY id", chunk):
                found[int(rid)] = (float(reward), stamp)
        return found

    def receipt_count(self) -> int:
        """Retrievals recorded."""
        return int(self.conn.execute("SELECT count(*) FROM retrievals").fetchone()[0])

    def receipt(self, retrieval_id: int) -> dict[str, Any] | None:
        """A receipt's query, parameters (JSON text), statistics, exploration flag, time, task id and scope, or None."""
        rows = dict_rows(self.conn.execute("SELECT id, query, params, sim_mean, sim_std, explored, created_at, task_id, "
                                           "scope FROM retrievals WHERE id = ?", (retrieval_id,)))
        return rows[0] if rows else None

    def receipt_candidates(self, retrieval_id: int) -> list[dict[str, Any]]:
        """A receipt's Phase-A candidates with their memory's intent and outcome, best score first."""
        return dict_rows(self.conn.execute(
            "SELECT c.memory_id, m.intent, m.outcome, c.recall_rank, c.similarity, c.q, c.z_sim, c.z_q, c.score, "
            "c.selected_rank FROM retrieval_candidates c JOIN memories m ON m.id = c.memory_id "
            "WHERE c.retrieval_id = ? ORDER BY c.score DESC, c.recall_rank", (retrieval_id,)))

    def receipt_selection(self, retrieval_id: int) -> list[tuple[int, int | None]]:
        """(memory id, selected rank or None) of a receipt's candidates."""
        return [(int(m), rank) for m, rank in self.conn.execute(
            "SELECT memory_id, selected_rank FROM retrieval_candidates WHERE retrieval_id = ?", (retrieval_id,))]

    def receipt_rewards(self, retrieval_id: int) -> list[dict[str, Any]]:
        """The ledger rows a receipt's rewards wrote, oldest first."""
        return dict_rows(self.conn.execute("SELECT memory_id, reward, alpha, q_before, q_after, created_at FROM rewards "
                                           "WHERE retrieval_id = ? ORDER BY id", (retrieval_id,)))

    def memory_receipts(self, memory_id: int) -> list[dict[str, Any]]:
        """The receipts a memory appeared in as a candidate, oldest first, with its place in each."""
        return dict_rows(self.conn.execute(
            "SELECT c.retrieval_id, r.query, r.created_at, c.recall_rank, c.similarity, c.q, c.score, c.selected_rank "
            "FROM retrieval_candidates c JOIN retrievals r ON r.id = c.retrieval_id WHERE c.memory_id = ? "
            "ORDER BY c.retrieval_id", (memory_id,)))
