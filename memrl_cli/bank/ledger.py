"""Q updates and their ledger: rewards (Q ← Q + α(R − Q), `memrl_cli.method.learning`) applied to the memories
a receipt selected or to given ids, outright Q assignments, and in-place revisions of a memory's
text. Every change of Q appends a ledger row, so Q is always the replay of its ledger.

A reward must lie in the bank's reward range: [-1, 1] unless the bank's meta `reward_range` widens
(or narrows) it (`memrl config reward_range MIN MAX`); every way in (CLI, proxy, MCP, the Python API)
goes through `Ledger.reward_many`, so none can move Q further.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from memrl_cli.bank.connection import BankConnection
from memrl_cli.errors import MemrlError
from memrl_cli.method.learning import DEFAULT_ALPHA, REWARD_RANGE, check_reward, check_reward_range
from memrl_cli.bank.records import check_text, content_hash, now

REWARD_FIELDS = {"reward", "retrieval_id", "memory_ids", "alpha", "floor", "source", "allow_repeat"}
# A checked reward request: (retrieval_id, memory_ids, reward, alpha, floor, source, allow_repeat).
RewardRequest = tuple[Any, ...]


class RewardedAlready(MemrlError):
    """A second reward for a receipt, without `allow_repeat` (each caller names its own way to allow it)."""

    def __init__(self, retrieval_id: int) -> None:
        self.retrieval_id = retrieval_id
        super().__init__(f"retrieval {retrieval_id} was already rewarded; pass allow_repeat to reward it again")


def check_reward_request(request: dict[str, Any], i: int, bounds: tuple[float, float] = REWARD_RANGE) -> RewardRequest:
    """Validate the `i`-th request of `reward_many` (0-based; the message numbers it from 2 on), its reward
    within `bounds`."""
    where = f"reward {i + 1}: " if i else ""
    unknown = set(request) - REWARD_FIELDS
    if unknown:
        raise MemrlError(f"{where}unknown field(s) {', '.join(sorted(map(str, unknown)))}; "
                         f"use {', '.join(sorted(REWARD_FIELDS))}")
    rid, ids = request.get("retrieval_id"), request.get("memory_ids")
    if (rid is None) == (ids is None):
        raise MemrlError(f"{where}give either a retrieval id or memory ids, not both or neither")
    if rid is not None and (isinstance(rid, bool) or not isinstance(rid, int)):
        raise MemrlError(f"{where}retrieval id must be an integer, got {rid!r}")
    if ids is not None:
        try:
            ids = list(dict.fromkeys(ids))  # each memory once, in the order given
        except TypeError:
            ids = None
        if not ids or not all(isinstance(m, int) and not isinstance(m, bool) for m in ids):
            raise MemrlError(f"{where}memory ids must be a non-empty list of integers")
    try:
        alpha = request["alpha"] if request.get("alpha") is not None else DEFAULT_ALPHA
        r, a, f = check_reward(request.get("reward"), alpha, request.get("floor"), bounds)
    except MemrlError as exc:
        raise MemrlError(f"{where}{exc}") from None
    return rid, ids, r, a, f, request.get("source"), bool(request.get("allow_repeat"))


class Ledger:
    """The Q updates of one bank."""

    def __init__(self, db: BankConnection) -> None:
        self.db = db

    def reward_range(self) -> tuple[float, float]:
        """The rewards this bank accepts, (min, max) inclusive: its meta `reward_range`, else [-1, 1]."""
        def read() -> tuple[float, float]:
            stored = self.db.meta("reward_range")
            return (float(stored["min"]), float(stored["max"])) if stored else REWARD_RANGE
        return self.db.cached("reward_range", read)

    def set_reward_range(self, bounds: tuple[float, float] | None) -> tuple[float, float]:
        """Store the bank's reward range (None: back to the default [-1, 1]); return the range in force."""
        with self.db.transaction():
            if bounds is None:
                self.db.store.delete_meta("reward_range")
            else:
                low, high = check_reward_range(*bounds)
                self.db.store.set_meta("reward_range", {"min": low, "max": high, "set_at": now()})
        return self.reward_range()

    def reward_many(self, requests: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """Several rewards in one transaction (all or none); [{"id", "q_before", "q_after"}] in the order applied."""
        db, store = self.db, self.db.store
        bounds = self.reward_range()
        checked = [check_reward_request(r, i, bounds) for i, r in enumerate(requests)]
        stamp = now()
        memory_ids = [mid for c in checked for mid in (c[1] or ())]
        if store.single_statement_writes and not db.depth and checked \
                and all(c[0] is None for c in checked) and len(set(memory_ids)) == len(memory_ids):
            # Given memories, each once: one statement that locks, updates and ledgers (one round trip)
            entries = [(None, mid, r, a, f, source) for _, ids, r, a, f, source, _ in checked for mid in ids]
            return [{"id": m, "q_before": b, "q_after": q} for m, b, q in db.single_statement(
                lambda: store.apply_rewards(entries, stamp))]
        updates: list[dict[str, Any]] = []
        with db.transaction():
            # Lock what this write reads and then changes, in id order (no deadlock between writers):
            # the receipts first (one reward per receipt), then the memories whose Q moves.
            db.lock("retrievals", {c[0] for c in checked if c[0] is not None})
            rewarded: set[int] = set()
            resolved = []
            for rid, ids, r, a, f, source, repeat in checked:
                if rid is not None:
                    if not store.has_receipt(rid):
                        raise MemrlError(f"unknown retrieval id {rid}")
                    if not repeat and (rid in rewarded or store.receipt_rewarded(rid)):
                        raise RewardedAlready(rid)
                    rewarded.add(rid)
                    ids = store.selected_ids(rid)
                resolved.append((rid, ids, r, a, f, source))
            db.lock("memories", {mid for entry in resolved for mid in entry[1]})
            # In request order, in runs of requests whose memories are distinct (one pass each): a memory that
            # recurs starts a new run, so it moves from the Q the run before left
            runs: list[list[tuple]] = [[]]
            seen: set[int] = set()
            for rid, ids, r, a, f, source in resolved:
                if not seen.isdisjoint(ids):
                    runs.append([])
                    seen = set()
                seen.update(ids)
                runs[-1] += [(rid, mid, r, a, f, source) for mid in ids]
            for run in runs:
                updates += [{"id": m, "q_before": b, "q_after": q} for m, b, q in store.apply_rewards(run, stamp)]
        return updates

    def revise(self, memory_id: int, experience: str) -> bool:
        """Replace a memory's experience text in place (MemP's adjustment rule); intent, vector and Q stay.

        Returns False, changing nothing, when another memory already holds exactly that content.
        """
        experience = check_text(experience, "experience", "")
        with self.db.transaction():
            row = next(iter(self.db.store.rows_by_id("memories", "intent, scope, metadata", [memory_id], lock=True)),
                       None)
            if row is None:
                raise MemrlError(f"unknown memory id {memory_id}")
            digest = content_hash(row[0], experience, row[1], json.loads(row[2] or "{}"))
            if self.db.store.content_elsewhere(digest, memory_id):
                return False
            self.db.store.set_experience(memory_id, experience, digest, now())
        return True

    def set_q(self, memory_id: int, q: float, source: str) -> None:
        """Assign Q outright (a `set` ledger row), e.g. after merging duplicates or a reset."""
        if not math.isfinite(q):
            raise MemrlError("q must be a finite number")
        with self.db.transaction():
            row = next(iter(self.db.store.rows_by_id("memories", "q", [memory_id], lock=True)), None)
            if row is None:
                raise MemrlError(f"unknown memory id {memory_id}")
            stamp = now()
            self.db.store.set_memory_q(memory_id, q, stamp)
            self.db.store.append_ledger(memory_id, [{"kind": "set", "q_before": row[0], "q_after": q,
                                                     "created_at": stamp, "source": source}])
