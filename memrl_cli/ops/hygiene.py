"""Memory hygiene for shared banks: quarantine and release memories, reset Q, undo rewards.

A bank that many agents write to (PostgreSQL, or a `.db` handed around) can receive bad memories
and bad rewards. These operations repair it without deleting anything:

- `quarantine` / `release`: a quarantined memory stays in the bank (exported, merged, shown by
  `inspect`) but no retrieval returns it, not even as a Phase-A candidate. Each change is logged
  in `quarantine_log` (who, when, why).
- `reset_q`: Q back to the memory's `q_init`, as a `set` row of the ledger.
- `undo`: revert the `reward` rows of a reward source and/or a time window. The Q rule is not
  commutative (a reward moves Q a fraction of the way from wherever Q is), so the honest result is
  the replay of the ledger without those rows: undo appends a `set` row back to the Q before the
  first undone row, then a copy of every later reward it keeps, re-applied in order (same reward,
  α, floor, source, receipt and time). Rows before a memory's last `set` row (a reset, a merge, an
  earlier undo) no longer influence its Q and are left alone (`superseded` in the report).

Each operation is one transaction; the ledger is only appended to, so Q stays the replay of the
ledger (`inspect --verify`). See docs/guarantees.md, "Memory hygiene for shared banks".
"""

from __future__ import annotations

import getpass
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from memrl_cli import validators
from memrl_cli.bank.memory_bank import MemoryBank
from memrl_cli.bank.records import check_text, now
from memrl_cli.errors import MemrlError
from memrl_cli.method.learning import q_update

def default_actor() -> str | None:
    """Who is acting, when nobody says: the login name of this process, if it has one."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


def memory_ids(ids: Iterable[Any]) -> list[int]:
    """Each id once, in the order given; a one-line error for anything but positive integers."""
    try:
        unique = list(dict.fromkeys(ids))
    except TypeError:
        unique = []
    if not unique or not all(map(validators.is_whole, unique)):
        raise MemrlError("give one or more memory ids (integers)")
    return unique


def _optional_text(value: str | None, name: str) -> str | None:
    return None if value is None else check_text(value, name, "")


def locked_memories(bank: MemoryBank, ids: list[int], columns: str) -> dict[int, tuple]:
    """Inside a write: the rows of `ids` (id first, then `columns`), locked; unknown ids refuse the write."""
    rows = {int(r[0]): r[1:] for r in bank.store.rows_by_id("memories", f"id, {columns}", ids, lock=True)}
    missing = [i for i in ids if i not in rows]
    if missing:
        shown = ", ".join(map(str, missing[:5])) + (", …" if len(missing) > 5 else "")
        raise MemrlError(f"unknown memory id{'s' if len(missing) > 1 else ''} {shown}; nothing was changed")
    return rows


def _mark(bank: MemoryBank, ids: Iterable[int], quarantine: bool, reason: str | None,
          actor: str | None) -> dict[str, list[int]]:
    wanted = memory_ids(ids)
    reason, actor = _optional_text(reason, "reason"), _optional_text(actor, "actor") or default_actor()
    stamp = now()
    with bank.transaction():
        state = locked_memories(bank, wanted, "quarantined_at")
        changed = [i for i in wanted if (state[i][0] is None) == quarantine]
        bank.store.set_quarantined(changed, stamp if quarantine else None)
        bank.store.log_quarantine([(i, "quarantine" if quarantine else "release", reason, actor, stamp) for i in changed])
    return {"changed": changed, "unchanged": [i for i in wanted if i not in changed]}


def quarantine(bank: MemoryBank, ids: Iterable[int], reason: str | None = None,
               actor: str | None = None) -> dict[str, list[int]]:
    """Exclude memories from every retrieval, atomically, logging who (default: the login name),
    when and why. Returns {"changed": ids now quarantined, "unchanged": ids that already were}."""
    return _mark(bank, ids, True, reason, actor)


def release(bank: MemoryBank, ids: Iterable[int], reason: str | None = None,
            actor: str | None = None) -> dict[str, list[int]]:
    """Let quarantined memories be retrieved again, atomically, logged like `quarantine`.
    Returns {"changed": ids released, "unchanged": ids that were not quarantined}."""
    return _mark(bank, ids, False, reason, actor)


def reset_q(bank: MemoryBank, ids: Iterable[int], reason: str | None = None,
            actor: str | None = None) -> list[dict[str, Any]]:
    """Set Q back to `q_init` for each memory, atomically, with a `set` ledger row each (source
    `reset-q by ACTOR: REASON`); visits are kept. Returns [{"id", "q_before", "q_after"}]."""
    wanted = memory_ids(ids)
    source = _describe("reset-q", _optional_text(reason, "reason"), _optional_text(actor, "actor") or default_actor())
    stamp = now()
    updates = []
    with bank.transaction():
        rows = locked_memories(bank, wanted, "q, q_init")
        for mid in wanted:
            q, q_init = float(rows[mid][0]), float(rows[mid][1])
            bank.store.set_memory_q(mid, q_init, stamp)
            bank.store.append_ledger(mid, [{"kind": "set", "q_before": q, "q_after": q_init, "created_at": stamp,
                                            "source": source}])
            updates.append({"id": mid, "q_before": q, "q_after": q_init})
    return updates


def _describe(action: str, reason: str | None, actor: str | None) -> str:
    return action + (f" by {actor}" if actor else "") + (f": {reason}" if reason else "")


def parse_time(value: str, name: str) -> str:
    """An ISO 8601 time as the ledger writes it (UTC, microseconds); a time without zone is UTC."""
    try:
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        raise MemrlError(f"{name} must be an ISO 8601 time such as 2026-01-31T12:00:00+00:00, got {value!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds")


def undo(bank: MemoryBank, source: str | None = None, since: str | None = None, until: str | None = None, *,
         dry_run: bool = False, reason: str | None = None, actor: str | None = None) -> dict[str, Any]:
    """Revert the `reward` rows whose source matches the pattern `source` (`*`, `?`) and/or whose
    time is in [`since`, `until`), so that each affected Q is the replay of its ledger without them
    (see the module's docstring for how). One transaction; with `dry_run`, nothing is written.

    Returns {"dry_run", "undone": rows reverted, "reapplied": later rows re-applied, "superseded":
    matching rows before a `set` row (left alone), "memories": [{"id", "q_before", "q_after",
    "undone", "reapplied"}]}.
    """
    if source is None and since is None and until is None:
        raise MemrlError("give --source, --since and/or --until: which rewards to undo")
    sources = [check_text(source, "source", "")] if source is not None else []
    window = (None if since is None else parse_time(since, "--since"), None if until is None else parse_time(until, "--until"))
    label = _describe("undo " + " ".join(f"{k}={v}" for k, v in (("source", source), ("since", since),
                                                                   ("until", until)) if v is not None),
                      _optional_text(reason, "reason"), _optional_text(actor, "actor") or default_actor())
    with bank.snapshot() if dry_run else bank.transaction():
        return _undo(bank, sources, window, label, dry_run)


def _undo(bank: MemoryBank, sources: list[str], window: tuple[str | None, str | None], label: str,
          dry_run: bool) -> dict[str, Any]:
    store = bank.store
    memory_ids, _ = store.rewards_matching(sources, *window)
    if not dry_run:
        store.lock_rows("memories", memory_ids)  # their ledgers cannot grow until this commits
    _, matched = store.rewards_matching(sources, *window)
    report: dict[str, Any] = {"dry_run": dry_run, "undone": 0, "reapplied": 0, "superseded": 0, "memories": []}
    stamp = now()
    for mid, q, visits in store.rows_by_id("memories", "id, q, visits", memory_ids):
        ledger = store.memory_ledger(mid)
        last_set = max((n for n, r in enumerate(ledger) if r["kind"] == "set"), default=-1)
        effective = ledger[last_set + 1:]  # the rows Q still depends on
        undone = [n for n, r in enumerate(effective) if r["id"] in matched]
        report["superseded"] += sum(r["id"] in matched for r in ledger[:last_set + 1])
        if not undone:
            continue
        kept = [r for r in effective[undone[0]:] if r["id"] not in matched]
        new_q = float(effective[undone[0]]["q_before"])
        rows = [{"kind": "set", "retrieval_id": None, "reward": None, "alpha": None, "q_floor": None,
                 "q_before": float(q), "q_after": new_q, "created_at": stamp, "source": label}]
        for r in kept:
            q_after = q_update(new_q, r["reward"], r["alpha"], r["q_floor"])
            rows.append({**r, "q_before": new_q, "q_after": q_after})
            new_q = q_after
        if not dry_run:
            store.append_ledger(mid, rows)
            store.set_memory_q(mid, new_q, stamp, visits=max(0, int(visits) - len(undone)))
        report["undone"] += len(undone)
        report["reapplied"] += len(kept)
        report["memories"].append({"id": int(mid), "q_before": float(q), "q_after": new_q, "undone": len(undone),
                                   "reapplied": len(kept)})
    return report
