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
from typing import Any, NamedTuple

from memrl_cli.bank.connection import BankConnection
from memrl_cli.errors import MemrlError
from memrl_cli.method.learning import DEFAULT_ALPHA, REWARD_RANGE, check_reward, check_reward_range
from memrl_cli.bank.records import check_scope, check_task_id, check_text, content_hash, now

REWARD_FIELDS = {"reward", "retrieval_id", "memory_ids", "task", "scope", "alpha", "floor", "source", "allow_repeat"}


class RewardRequest(NamedTuple):
    """A checked reward request: what it rewards (a receipt, memory ids, or a task's receipt), how, and the scope
    it acts in (`scoped`: only receipts, memories and tasks of `scope`, None being no scope)."""

    retrieval_id: int | None
    memory_ids: list[int] | None
    task: str | None
    reward: float
    alpha: float
    floor: float | None
    source: str | None
    allow_repeat: bool
    scoped: bool
    scope: str | None


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
    rid, ids, task = request.get("retrieval_id"), request.get("memory_ids"), request.get("task")
    if sum(x is not None for x in (rid, ids, task)) != 1:
        raise MemrlError(f"{where}give one of a retrieval id, memory ids or a task id")
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
        task = check_task_id(task)
        scope = check_scope(request.get("scope"))
        alpha = request["alpha"] if request.get("alpha") is not None else DEFAULT_ALPHA
        r, a, f = check_reward(request.get("reward"), alpha, request.get("floor"), bounds)
    except MemrlError as exc:
        raise MemrlError(f"{where}{exc}") from None
    return RewardRequest(rid, ids, task, r, a, f, request.get("source"), bool(request.get("allow_repeat")),
                         "scope" in request, scope)


def in_scope(scope: str | None) -> str:
    """How a message names a scope."""
    return "without a scope" if scope is None else f"in scope {scope}"


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

    def task_receipt(self, task: str, scope: str | None = None, any_scope: bool = True) -> int:
        """The receipt a task id names: its newest receipt in `scope` (None: without a scope), or with `any_scope`
        in whichever scope it was retrieved in (refused when that is more than one)."""
        found = self.db.store.task_receipts(task, scope, any_scope)
        if not found:
            raise MemrlError(f"no retrieval has task id {task!r}" + ("" if any_scope else f" {in_scope(scope)}")
                             + "; see `memrl log`")
        if len(found) > 1:
            scopes = ", ".join("(none)" if s is None else s for _, s in found)
            raise MemrlError(f"task id {task!r} was retrieved for in several scopes ({scopes}): give the scope")
        return found[0][0]

    def reward_many(self, requests: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """Several rewards in one transaction (all or none); [{"id", "q_before", "q_after"}] in the order applied
        (with `"forgotten": true` for a memory a receipt selected that has been forgotten since). A reward of a
        receipt ends its task (a server opens a new one for the task's next call), even one that selected nothing.
        A request with a `scope` acts in it alone (its receipts, memories and tasks); memory ids must name
        memories that are not forgotten."""
        db, store = self.db, self.db.store
        bounds = self.reward_range()
        checked = [check_reward_request(r, i, bounds) for i, r in enumerate(requests)]
        stamp = now()
        direct = [mid for c in checked for mid in (c.memory_ids or ())]
        self._check_memories(direct, False)
        if store.single_statement_writes and not db.depth and checked and len(set(direct)) == len(direct) \
                and all(c.memory_ids is not None and not c.scoped for c in checked):
            # Given memories, each once: one statement that locks, updates and ledgers (one round trip)
            entries = [(None, mid, c.reward, c.alpha, c.floor, c.source) for c in checked for mid in c.memory_ids or ()]
            return [{"id": m, "q_before": b, "q_after": q} for m, b, q in db.single_statement(
                lambda: store.apply_rewards(entries, stamp))]
        updates: list[dict[str, Any]] = []
        with db.transaction():
            resolved_ids = [self.task_receipt(c.task, c.scope, not c.scoped) if c.task is not None else c.retrieval_id
                            for c in checked]
            # Lock what this write reads and then changes, in the order every writer takes them (no deadlock):
            # the receipts first (one reward per receipt), then the memories whose Q moves (in id order), and
            # only then the task rows, which a receipt's writer changes after locking its memories.
            db.lock("retrievals", {rid for rid in resolved_ids if rid is not None})
            rewarded: set[int] = set()
            resolved = []
            for c, rid in zip(checked, resolved_ids):
                ids = c.memory_ids or []
                if rid is not None:
                    found, scope = store.receipt_scope(rid)
                    if not found:
                        raise MemrlError(f"unknown retrieval id {rid}")
                    if c.scoped and scope != c.scope:
                        raise MemrlError(f"retrieval {rid} was retrieved {in_scope(scope)}, not {in_scope(c.scope)}")
                    if not c.allow_repeat and (rid in rewarded or store.receipt_rewarded(rid)):
                        raise RewardedAlready(rid)
                    rewarded.add(rid)
                    ids = store.selected_ids(rid)
                elif c.scoped:
                    self._check_memories(ids, True, c.scope)
                resolved.append((rid, ids, c.reward, c.alpha, c.floor, c.source))
            db.lock("memories", {mid for entry in resolved for mid in entry[1]})
            store.end_tasks(sorted(rewarded), stamp)
            forgotten = {int(r[0]) for r in store.rows_by_id("memories", "id, forgotten_at",
                                                             {mid for entry in resolved for mid in entry[1]})
                         if r[1] is not None}
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
                updates += [{"id": m, "q_before": b, "q_after": q, **({"forgotten": True} if m in forgotten else {})}
                            for m, b, q in store.apply_rewards(run, stamp)]
        return updates

    def _check_memories(self, memory_ids: list[int], scoped: bool, scope: str | None = None) -> None:
        """Refuse to reward forgotten memories directly (a reward would teach nothing: they are never retrieved),
        and, when `scoped`, memories of another scope than `scope`."""
        if not memory_ids:
            return
        rows = self.db.store.rows_by_id("memories", "id, forgotten_at, replaced_by, scope", memory_ids)
        for mid, forgotten_at, replaced_by, scope_of in rows:
            if forgotten_at is not None:
                raise MemrlError(f"memory {mid} " + (f"was replaced by memory {replaced_by} (memrl edit): reward that"
                                                     if replaced_by is not None else
                                                     "is forgotten: it is never retrieved again, so a reward would "
                                                     "teach nothing") + "; nothing was written")
            if scoped and scope_of != scope:
                raise MemrlError(f"memory {mid} is {in_scope(scope_of)}, not {in_scope(scope)}")

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
