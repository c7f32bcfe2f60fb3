"""The Store's writes for repairing and moving memories: quarantine marks and their log, forget marks, ledger rows
appended outside the Q rule (`set` rows, undo, import, merge), and the rows those writes read first.
Every method runs inside the caller's write transaction. Mixed into `memrl_cli.store.base.Store`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

LEDGER_INSERT = ("INSERT INTO rewards (retrieval_id, memory_id, kind, reward, alpha, q_floor, q_before, q_after, "
                 "created_at, source) VALUES (?,?,?,?,?,?,?,?,?,?)")


class BankRepairs:
    """Writes of hygiene (`memrl_cli.ops.hygiene`) and transfer (`memrl_cli.ops.transfer`)."""

    conn: Any
    _for_update: str

    def matches(self, column: str, patterns: Sequence[str]) -> tuple[str, list[str]]:
        raise NotImplementedError

    def set_quarantined(self, memory_ids: Sequence[int], at: str | None) -> None:
        """Mark memories quarantined since `at`, or (None) released."""
        self.conn.executemany("UPDATE memories SET quarantined_at = ? WHERE id = ?", [(at, i) for i in memory_ids])

    def forget_memories(self, rows: Sequence[tuple[int, str, int | None]], at: str) -> None:
        """Mark memories forgotten since `at`: (id, the content hash it keeps from now on, the memory an
        edit replaced it with or None). The row, its ledger and its receipts stay (`memrl_cli.ops.memories`)."""
        self.conn.executemany("UPDATE memories SET forgotten_at = ?, content_hash = ?, replaced_by = ? WHERE id = ?",
                              [(at, digest, replaced_by, mid) for mid, digest, replaced_by in rows])

    def erase_memories(self, memory_ids: Sequence[int], vector: Any) -> None:
        """Erase memories' content: their texts and metadata emptied, their vector replaced by `vector` (the
        engine's zero vector) and dropped from the engine's index, their content hash `erased:ID`. Id, Q, ledger,
        receipts and marks stay."""
        self.conn.executemany("UPDATE memories SET intent = '', experience = '', metadata = '{}', content_hash = ?, "
                              "embedding = ? WHERE id = ?", [(f"erased:{mid}", vector, mid) for mid in memory_ids])
        self.unindex(memory_ids)

    def unindex(self, memory_ids: Sequence[int]) -> None:
        """Inside a write: drop these memories' copies from the engine's optional index."""

    def log_quarantine(self, rows: Sequence[tuple[int, str, str | None, str | None, str]]) -> None:
        """Append (memory_id, action, reason, actor, created_at) rows to the quarantine log."""
        self.conn.executemany("INSERT INTO quarantine_log (memory_id, action, reason, actor, created_at) "
                              "VALUES (?,?,?,?,?)", list(rows))

    def append_ledger(self, memory_id: int, rows: Sequence[dict[str, Any]]) -> None:
        """Append ledger rows to a memory's ledger as given (kind, q_before, q_after, created_at; reward,
        alpha, q_floor, source and retrieval_id when present): Q itself is the caller's to set."""
        self.conn.executemany(LEDGER_INSERT, [
            (r.get("retrieval_id"), memory_id, r["kind"], r.get("reward"), r.get("alpha"), r.get("q_floor"),
             r["q_before"], r["q_after"], r["created_at"], r.get("source")) for r in rows])

    def set_memory_q(self, memory_id: int, q: float, stamp: str, visits: int | None = None) -> None:
        """Set a memory's Q (and visits, when given) outside the Q rule; its ledger row is the caller's."""
        if visits is None:
            self.conn.execute("UPDATE memories SET q = ?, updated_at = ? WHERE id = ?", (q, stamp, memory_id))
        else:
            self.conn.execute("UPDATE memories SET q = ?, visits = ?, updated_at = ? WHERE id = ?",
                              (q, visits, stamp, memory_id))

    def rewards_matching(self, sources: Sequence[str] = (), since: str | None = None,
                         until: str | None = None) -> tuple[set[int], set[int]]:
        """(memory ids, ledger row ids) of the `reward` rows whose source matches one of the patterns
        `sources` (`Store.matches`) and whose time is in [`since`, `until`), each bound optional."""
        conditions: list[str] = ["kind = 'reward'"]
        args: list[str] = []
        if sources:
            condition, args = self.matches("source", sources)
            conditions.append(condition)
        if since is not None:
            conditions.append("created_at >= ?")
            args.append(since)
        if until is not None:
            conditions.append("created_at < ?")
            args.append(until)
        rows = self.conn.execute(f"SELECT id, memory_id FROM rewards WHERE {' AND '.join(conditions)}", args).fetchall()
        return {int(r[1]) for r in rows}, {int(r[0]) for r in rows}

    def memory_with_content(self, digest: str) -> tuple[int, float, int, str | None] | None:
        """(id, q, visits, quarantined_at) of the memory with this content hash, locked; or None."""
        row = self.conn.execute(f"SELECT id, q, visits, quarantined_at FROM memories WHERE content_hash = ?"
                                f"{self._for_update}", (digest,)).fetchone()
        return None if row is None else (int(row[0]), float(row[1]), int(row[2]), row[3])
