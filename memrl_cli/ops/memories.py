"""The everyday operations over a bank: list and filter memories, forget one, edit one, a memory's
history of versions and rewards, and the log of recent retrievals (receipts) with their reward state.

Forgetting erases a memory's content but keeps its bookkeeping: its texts, metadata and vector are erased
(the vector becomes the zero vector and leaves the engine's index), and those of the earlier versions
`memrl edit` replaced with it, while the row keeps its id, Q, outcome, source, scope, its ledger and the receipts it appeared
in, so Q is still the replay of the ledger (`inspect --verify`), an old receipt still says what it
selected, and a late reward for it still lands somewhere consistent. A forgotten memory is never
retrieved (not even as a candidate), is left out of `memrl memories` and of exports, and its content
no longer counts as stored: ingesting the same text again makes a new memory. The erased bytes may
linger in the file's free pages until it is compacted: `forget(..., vacuum=True)` (`memrl forget
--vacuum`) does that (SQLite's VACUUM; on PostgreSQL, VACUUM FULL of the tables that held them).

An edit writes the memory's next version: a new memory (a new id) with the changed texts and the
unchanged rest (task, source, scope, metadata), its Q and visits carried over (its initial Q is the
old memory's Q, so its own ledger replays from there), and the old version forgotten with a link
to the new one (`replaced_by`). The intent is embedded again only when it changed. Stored vectors
never change in place, so no index (sqlite-vec, HNSW, the in-process matrix) can go stale, and
`history` shows every version with its ledger.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from memrl_cli.bank.memory_bank import MemoryBank
from memrl_cli.errors import MemrlError
from memrl_cli.ops.hygiene import locked_memories, memory_ids
from memrl_cli.ops.inspection import with_ledger
from memrl_cli.bank.records import OUTCOMES, MemoryInput, check_text, content_hash, now
from memrl_cli.method.retrieval import patterns
from memrl_cli.store.views import MEMORY_ORDERS

MAX_LIST = 100_000


def list_memories(bank: MemoryBank, *, outcomes: Sequence[str] = (), sources: Sequence[str] = (),
                  scopes: Sequence[str] = (), q_min: float | None = None, q_max: float | None = None,
                  text: str | None = None, forgotten: bool = False, order: str = "newest",
                  limit: int = 50) -> list[dict[str, Any]]:
    """The memories that pass every filter given, at most `limit`, in `order` (newest, oldest, q: highest
    first, visits: most first): `outcomes` (any of), `sources`/`scopes` (shell-style patterns, any of),
    Q in [`q_min`, `q_max`], `text` (a case-insensitive substring of the intent or the experience; "" is in
    every text, as no `text`).
    Forgotten memories are left out, or with `forgotten` listed alone."""
    bad = [o for o in outcomes if o not in OUTCOMES]
    if bad:
        raise MemrlError(f"outcome must be one of {', '.join(OUTCOMES)}, got {bad[0]!r}")
    if order not in MEMORY_ORDERS:
        raise MemrlError(f"order must be one of {', '.join(MEMORY_ORDERS)}, got {order!r}")
    if not (isinstance(limit, int) and 1 <= limit <= MAX_LIST):
        raise MemrlError(f"limit must be an integer in [1, {MAX_LIST}], got {limit!r}")
    if q_min is not None and q_max is not None and q_min > q_max:
        raise MemrlError(f"--q-min ({q_min}) is above --q-max ({q_max}): no memory can pass")
    conditions: list[tuple[str, Any]] = [("forgotten", forgotten)]
    if outcomes:
        conditions.append(("outcome", list(dict.fromkeys(outcomes))))
    for name, value in (("source", sources), ("scope", scopes)):
        if value:
            conditions.append((name, patterns(value, name + "s")))
    conditions += [(name, float(value)) for name, value in (("q_min", q_min), ("q_max", q_max)) if value is not None]
    if text:
        conditions.append(("text", check_text(text, "--text", "")))
    with bank.snapshot():
        return bank.store.find_memories(conditions, order, limit)


def forget(bank: MemoryBank, ids: Iterable[int], vacuum: bool = False) -> dict[str, Any]:
    """Forget memories, atomically, erasing their content and that of their earlier and later versions (see
    the module's docstring), and of the versions `memrl edit` replaced with them; with `vacuum`, then compact the bank so that the file no longer holds the erased
    bytes. Returns {"forgotten": ids forgotten or erased now, "unchanged": ids that already were, "erased":
    every id whose content was erased now, earlier versions included, "vacuumed": whether the file was compacted
    whole (False without `vacuum`, or when a reader kept some bytes)}; an unknown id refuses the whole call."""
    wanted = memory_ids(ids)
    stamp = now()
    with bank.transaction():
        rows = locked_memories(bank, wanted, "forgotten_at, content_hash")
        versions = sorted({v for mid in wanted for v in _earlier(bank, mid)})
        state = locked_memories(bank, versions, "forgotten_at, content_hash")
        marked = [i for i in wanted if rows[i][0] is None]
        bank.store.forget_memories([(i, _tombstone_hash(i, rows[i][1]), None) for i in marked], stamp)
        erased = [v for v in versions if not str(state[v][1]).startswith("erased:")]
        if erased:
            dim = bank.dim or 1
            bank.store.erase_memories(erased, bank.store.encode(np.zeros(dim, dtype=np.float32)))
    changed = [i for i in wanted if i in marked or i in erased]
    vacuumed = bank.store.vacuum() if vacuum else False
    return {"forgotten": changed, "unchanged": [i for i in wanted if i not in changed], "erased": erased,
            "vacuumed": vacuumed}


def _earlier(bank: MemoryBank, memory_id: int) -> list[int]:
    """A memory and the versions `memrl edit` replaced with it, one after the other (all forgotten already)."""
    chain = [memory_id]
    while (before := bank.store.version_links(chain[-1])[0]) is not None and before not in chain:
        chain.append(before)
    return chain


def _tombstone_hash(memory_id: int, digest: str) -> str:
    """The content hash a forgotten memory keeps: unique, and no longer the hash of its content."""
    return f"forgotten:{memory_id}:{digest}"


def edit(bank: MemoryBank, memory_id: int, *, intent: str | None = None, experience: str | None = None,
         outcome: str | None = None, vector: list[float] | None = None) -> dict[str, Any]:
    """Write the next version of a memory with the given fields changed (see the module's docstring):
    {"id": the new version's id, "replaces": `memory_id`, "reembedded": whether the intent changed}.
    A changed intent is embedded by the bank's embedder, or takes `vector` (an external embedder's)."""
    if intent is None and experience is None and outcome is None:
        raise MemrlError("give --intent, --experience and/or --outcome: what to change")
    fields = ("intent", "experience", "outcome", "task_id", "source", "q", "visits", "metadata", "scope",
              "forgotten_at", "quarantined_at", "embedding")
    with bank.snapshot():
        found = bank.store.rows_by_id("memories", ", ".join(fields), [memory_id])
    if not found:
        raise MemrlError(f"unknown memory id {memory_id}")
    old = dict(zip(fields, found[0]))
    if old["forgotten_at"] is not None:
        raise MemrlError(f"memory {memory_id} is forgotten" + ("" if not _successor(bank, memory_id) else
                         f"; its current version is {_current(bank, memory_id)}"))
    new = MemoryInput.parse({"intent": old["intent"] if intent is None else intent,
                             "experience": old["experience"] if experience is None else experience,
                             "outcome": old["outcome"] if outcome is None else outcome, "task_id": old["task_id"],
                             "source": old["source"], "q": float(old["q"]), "metadata": json.loads(old["metadata"]),
                             "scope": old["scope"]})
    if old["quarantined_at"] is not None:
        raise MemrlError(f"memory {memory_id} is quarantined: release it first (`memrl release {memory_id}`), "
                         "or forget it")
    if (new.intent, new.experience, new.outcome) == (old["intent"], old["experience"], old["outcome"]):
        raise MemrlError(f"memory {memory_id} already reads so: nothing to change")
    reembed = new.intent != old["intent"]
    if vector is not None and not reembed:
        raise MemrlError("a vector goes with a new intent: give --intent too")
    vectors = bank.vectors_for([new.intent], [vector]) if reembed else bank.store.decode([old["embedding"]])
    stamp = now()
    with bank.transaction(), bank.importing(vectors.astype(np.float32)) as insert:
        row = locked_memories(bank, [memory_id], "q, visits, forgotten_at, content_hash")[memory_id]
        if row[2] is not None:
            raise MemrlError(f"memory {memory_id} was forgotten meanwhile; nothing was changed")
        new.q = float(row[0])  # as it is now, not when the texts were read
        digest = content_hash(new.intent, new.experience, new.scope, new.metadata)
        if digest != row[3]:
            clash = bank.store.memory_with_content(digest)
            if clash is not None:
                raise MemrlError(f"memory {clash[0]} already holds exactly that content; nothing was changed")
        bank.store.forget_memories([(memory_id, _tombstone_hash(memory_id, row[3]), None)], stamp)
        new_id = insert(new, vectors[0], stamp, {"q_init": new.q, "visits": int(row[1])})
        if new_id is None:
            raise MemrlError("another memory holds exactly that content; nothing was changed")
        bank.store.forget_memories([(memory_id, _tombstone_hash(memory_id, row[3]), new_id)], stamp)
    return {"id": new_id, "replaces": memory_id, "reembedded": reembed}


def _successor(bank: MemoryBank, memory_id: int) -> int | None:
    return bank.store.version_links(memory_id)[1]


def _current(bank: MemoryBank, memory_id: int) -> int:
    """The newest version of a memory (itself when never edited)."""
    seen = {memory_id}
    while (after := _successor(bank, memory_id)) is not None and after not in seen:
        memory_id = after
        seen.add(after)
    return memory_id


def history(bank: MemoryBank, memory_id: int) -> dict[str, Any]:
    """Every version of a memory, oldest first, each with its ledger (rewards and Q assignments) and
    its quarantine log: {"id", "current": the newest version's id, or None when it is forgotten,
    "versions": [...]}. Any version's id finds them all."""
    with bank.snapshot():
        if bank.store.memory_record(memory_id) is None:
            raise MemrlError(f"unknown memory id {memory_id}")
        first, seen = memory_id, {memory_id}
        while (before := bank.store.version_links(first)[0]) is not None and before not in seen:
            first = before
            seen.add(before)
        chain, current = [first], first
        while (after := _successor(bank, current)) is not None and after not in chain:
            chain.append(after)
            current = after
        versions = [with_ledger(bank, mid) for mid in chain]
    last = versions[-1]
    return {"id": memory_id, "current": None if last["forgotten_at"] is not None else last["id"], "versions": versions}


def receipts(bank: MemoryBank, count: int = 10, unrewarded: bool = False) -> list[dict[str, Any]]:
    """The newest `count` retrievals (receipts), newest first: {"id", "task_id", "scope", "query", "created_at",
    "explored", "memories": the ids it selected, "rewarded", "reward": the latest reward or None, "rewarded_at"}.
    With `unrewarded`, only those that selected memories and were not rewarded yet."""
    if not (isinstance(count, int) and 1 <= count <= MAX_LIST):
        raise MemrlError(f"count must be an integer in [1, {MAX_LIST}], got {count!r}")
    with bank.snapshot():
        rows = bank.store.recent_receipts(count, unrewarded)
        ids = [int(r["id"]) for r in rows]
        selected = bank.store.receipts_selected(ids)
        rewarded = bank.store.receipts_rewarded(ids)
    for r in rows:
        r["explored"] = bool(r["explored"])
        r["memories"] = selected[int(r["id"])]
        reward = rewarded.get(int(r["id"]))
        r["rewarded"] = reward is not None
        r["reward"], r["rewarded_at"] = reward if reward is not None else (None, None)
    return rows


def newest_receipt(bank: MemoryBank, allow_repeat: bool = False) -> dict[str, Any]:
    """The newest retrieval (`reward --last`), as `receipts` lists it; refused in one line when there is none,
    when it selected no memories, and (unless `allow_repeat`) when it was rewarded already."""
    found = receipts(bank, 1)
    if not found:
        raise MemrlError("no retrieval yet: nothing to reward")
    receipt = found[0]
    if not receipt["memories"]:
        raise MemrlError(f"the newest receipt is {describe_receipt(receipt)}: it selected no memories, so there is "
                         "nothing to reward; nothing was written (see `memrl log`)")
    if receipt["rewarded"] and not allow_repeat:
        raise MemrlError(f"the newest receipt is {describe_receipt(receipt)}: it was already rewarded; nothing was "
                         "written (reward another with --retrieval N or --task ID; see `memrl log`)")
    return receipt


def describe_receipt(receipt: dict[str, Any], chars: int = 60) -> str:
    """`retrieval 7 (task ticket-1: "heat an egg in the…")`: a receipt named for people."""
    query = " ".join(str(receipt["query"]).split())
    start = query if len(query) <= chars else query[:chars - 1].rstrip() + "…"
    task = f"task {receipt['task_id']}: " if receipt.get("task_id") is not None else ""
    return f"retrieval {receipt['id']} ({task}{json.dumps(start, ensure_ascii=False)})"
