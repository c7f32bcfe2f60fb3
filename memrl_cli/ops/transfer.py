"""Moving memories between banks and machines: JSONL export/import, merge, and online backup.

The export format is JSONL: a header line `{"memrl_export": 1, "embedder": {...}, ...}`, then
one memory per line with its Q, initial Q, visits, timestamps, metadata, its reward ledger, its
quarantine log (when it has one) and, optionally, its vector. Import re-embeds when the vectors
are absent or came from another embedder. Plain ingest lines (`{"intent", "experience", ...}`)
import too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import IO, Any

import numpy as np

from memrl_cli.bank.memory_bank import MemoryBank
from memrl_cli.bank.records import MemoryInput, Progress, content_hash, now
from memrl_cli.errors import MemrlError
from memrl_cli.method.learning import replay
from memrl_cli.store.base import Store, is_server_url
from memrl_cli.validators import is_finite, is_whole

EXPORT_VERSION = 1
STORED_FIELDS = ("q_init", "visits", "created_at", "updated_at", "last_used_at", "ledger", "quarantine_log")
LEDGER_FIELDS = ("kind", "reward", "alpha", "q_floor", "q_before", "q_after", "created_at", "source")


def read_jsonl(stream: IO[bytes]) -> Iterator[tuple[int, Any]]:
    """(line number, decoded object) for each non-blank line; a bad line raises with its number."""
    for number, raw in enumerate(stream, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise MemrlError(f"line {number}: not valid UTF-8; nothing was written") from None
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            raise MemrlError(f"line {number}: invalid JSON ({exc.msg} at column {exc.colno}); nothing was written") from None


def parse_ingest_lines(stream: IO[bytes]) -> list[MemoryInput]:
    """Validate a whole JSONL ingest stream before anything is written (a `memrl export` file is pointed
    to `memrl import`, which keeps its Q and ledgers)."""
    records = []
    for number, obj in read_jsonl(stream):
        if number == 1 and isinstance(obj, dict) and "memrl_export" in obj:
            raise MemrlError("this is a `memrl export` file (its line 1 is the export header): load it with "
                             "`memrl import FILE` (or `memrl export | memrl import -`), which keeps Q and the ledger")
        records.append(MemoryInput.parse(obj, f"line {number}: "))
    return records


def export_jsonl(bank: MemoryBank, out: IO[str], vectors: bool = False) -> int:
    """Write the bank as JSONL; return the number of memories written.

    The ledgers and the memories are read from one state of the bank (while others may write), so
    every exported Q is the replay of its exported ledger.
    """
    with bank.snapshot():
        return _export(bank, out, vectors)


def _export(bank: MemoryBank, out: IO[str], vectors: bool) -> int:
    embedder = bank.meta("embedder")
    out.write(json.dumps({"memrl_export": EXPORT_VERSION, "engine": bank.store.kind,
                          "schema": bank.store.schema_version(), "embedder": embedder,
                          "vectors": vectors, "exported_at": now()}) + "\n")
    ledgers = {mid: [{k: r[k] for k in LEDGER_FIELDS} for r in rows] for mid, rows in bank.store.ledgers().items()}
    quarantines = bank.store.quarantine_logs()
    n = 0
    for row in bank.store.memories_in_order(vectors):
        if row[14] is not None:  # forgotten (`memrl forget`): gone for whoever reads the export
            continue
        record = dict(zip(("intent", "experience", "outcome", "task_id", "source", "q", "q_init", "visits",
                           "created_at", "updated_at", "last_used_at"), row[1:12]))
        record["metadata"] = json.loads(row[12])
        if row[13] is not None:  # only then, so that exports without scopes stay readable by older memrl
            record["scope"] = row[13]
        record["ledger"] = ledgers.get(row[0], [])
        if row[0] in quarantines:  # only then, so that exports without quarantines stay readable by older memrl
            record["quarantine_log"] = quarantines[row[0]]
        if vectors:
            record["vector"] = bank.store.decode([row[15]])[0].tolist()
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
        n += 1
    return n


def _ledger_problem(row: Any) -> str | None:
    """Why a ledger row cannot have been written by memrl, or None."""
    if not isinstance(row, dict) or row.get("kind") not in ("reward", "set"):
        return "is not a reward or set row"
    if not (is_finite(row.get("q_before")) and is_finite(row.get("q_after"))):
        return "has no finite q_before/q_after"
    if row["kind"] == "reward" and not (is_finite(row.get("reward")) and is_finite(row.get("alpha"))
                                        and 0 < row["alpha"] <= 1
                                        and (row.get("q_floor") is None or is_finite(row["q_floor"]))):
        return "has no finite reward, alpha in (0, 1] and floor"
    if not all(row.get(k) is None or isinstance(row[k], str) for k in ("created_at", "source")):
        return "has a created_at or source that is not text"
    return None


def _parse_stored(obj: Any, where: str) -> tuple[MemoryInput, dict[str, Any]]:
    """Split an export line into the memory and its stored state (initial Q, visits, ledger, times).

    The state must be consistent: Q is the replay of the ledger from the initial Q.
    """
    if not isinstance(obj, dict):
        raise MemrlError(f"{where}expected a JSON object")
    stored = {k: obj[k] for k in STORED_FIELDS if k in obj}
    memory = MemoryInput.parse({k: v for k, v in obj.items() if k not in STORED_FIELDS}, where)
    ledger = stored.get("ledger", [])
    if not isinstance(ledger, list):
        raise MemrlError(f"{where}ledger must be a list of reward rows")
    for number, row in enumerate(ledger, start=1):
        problem = _ledger_problem(row)
        if problem:
            raise MemrlError(f"{where}ledger row {number} {problem}")
    log = stored.get("quarantine_log", [])
    if not isinstance(log, list) or not all(
            isinstance(r, dict) and r.get("action") in ("quarantine", "release") and isinstance(r.get("created_at"), str)
            and all(r.get(k) is None or isinstance(r[k], str) for k in ("reason", "actor")) for r in log):
        raise MemrlError(f"{where}quarantine_log must be a list of {{\"action\": \"quarantine\" or \"release\", "
                         "\"created_at\", \"reason\"?, \"actor\"?}} rows")
    visits = stored.get("visits", 0)
    if not is_whole(visits) or visits < 0:
        raise MemrlError(f"{where}visits must be a non-negative integer")
    if not all(stored.get(k) is None or isinstance(stored[k], str) for k in ("created_at", "updated_at", "last_used_at")):
        raise MemrlError(f"{where}created_at, updated_at and last_used_at must be text")
    stored.setdefault("q_init", memory.q if not ledger else ledger[0]["q_before"])
    if not is_finite(stored["q_init"]):
        raise MemrlError(f"{where}q_init must be a finite number")
    chain = [stored["q_init"]] + [r["q_after"] for r in ledger]
    if any(abs(r["q_before"] - before) > 1e-9 for r, before in zip(ledger, chain)) or \
            abs(replay(stored["q_init"], ledger) - memory.q) > 1e-9:
        raise MemrlError(f"{where}q is not the replay of the memory's ledger from its q_init")
    return memory, stored


def read_export(stream: IO[bytes]) -> tuple[dict[str, Any] | None, list[tuple[MemoryInput, dict[str, Any]]]]:
    """Validate a whole export (or plain ingest lines): (the exporting bank's embedder, records)."""
    embedder: dict[str, Any] | None = None
    records: list[tuple[MemoryInput, dict[str, Any]]] = []
    for number, obj in read_jsonl(stream):
        if isinstance(obj, dict) and "memrl_export" in obj:
            if obj["memrl_export"] != EXPORT_VERSION:
                raise MemrlError(f"line {number}: export format {obj['memrl_export']!r} is not supported "
                                 f"(this memrl reads {EXPORT_VERSION})")
            embedder = obj.get("embedder")
            if embedder is not None and not (isinstance(embedder, dict) and isinstance(embedder.get("spec"), str)
                                             and isinstance(embedder.get("dim"), int) and embedder["dim"] > 0):
                raise MemrlError(f"line {number}: the export header's embedder needs a spec and a positive dim")
            continue
        records.append(_parse_stored(obj, f"line {number}: "))
    return embedder, records


def import_jsonl(bank: MemoryBank, stream: IO[bytes], progress: Progress | None = None,
                 merge_duplicates: bool = False, source_name: str = "import") -> dict[str, int]:
    """Import an export (or plain ingest lines) atomically; see `import_records`."""
    embedder, records = read_export(stream)
    return import_records(bank, records, embedder, progress, merge_duplicates, source_name)


def import_records(bank: MemoryBank, records: list[tuple[MemoryInput, dict[str, Any]]],
                   embedder: dict[str, Any] | None, progress: Progress | None = None,
                   merge_duplicates: bool = False, source_name: str = "import") -> dict[str, int]:
    """Insert memories with their stored state, all or nothing.

    Vectors are used only when they come from this bank's embedder (same spec and dimension);
    otherwise intents are re-embedded. An exact duplicate is skipped, or with
    `merge_duplicates` reconciled: Q becomes the visit-weighted mean, visits add up, and the
    incoming ledger is kept after a `set` row that starts its chain, followed by a `set` row
    to the merged Q, so Q still equals the replay of the ledger.
    """
    mine = bank.meta("embedder") or {"spec": bank.embedder.spec, "dim": bank.embedder.dim}  # a new bank: its own
    same_space = embedder is not None and (mine["spec"], int(mine["dim"])) == (embedder["spec"], int(embedder["dim"]))
    if not same_space:
        for memory, _ in records:
            memory.vector = None
    vectors = bank.vectors_for([m.intent for m, _ in records], [m.vector for m, _ in records], progress) \
        if records else np.zeros((0, 0), dtype=np.float32)
    counts = {"created": 0, "duplicates": 0, "merged": 0}
    stamp = now()
    with bank.transaction(), bank.importing(vectors) as insert:
        store = bank.store
        for (memory, stored), vector in zip(records, vectors):
            existing = store.memory_with_content(content_hash(memory.intent, memory.experience, memory.scope,
                                                              memory.metadata))
            ledger = stored.get("ledger", [])
            if existing is None:
                mid = insert(memory, vector, stamp, stored)
                if mid is None:  # another writer stored the same content since the check (PostgreSQL)
                    counts["duplicates"] += 1
                    continue
                _append_ledger(store, mid, ledger)
                _append_quarantine_log(store, mid, stored.get("quarantine_log", []), None, source_name, stamp)
                counts["created"] += 1
            elif merge_duplicates:
                mid, q_here, visits_here, quarantined_at = existing
                visits_in = int(stored.get("visits", 0))
                total = visits_here + visits_in
                merged_q = (q_here * visits_here + memory.q * visits_in) / total if total else (q_here + memory.q) / 2
                last_q = _append_ledger(store, mid, ledger, start=(q_here, float(stored["q_init"]), source_name))
                _append_ledger(store, mid, [{"kind": "set", "q_before": last_q, "q_after": merged_q,
                                             "created_at": stamp, "source": f"merge: visit-weighted Q ({source_name})"}])
                store.set_memory_q(mid, merged_q, stamp, visits=total)
                _append_quarantine_log(store, mid, stored.get("quarantine_log", []), quarantined_at, source_name, stamp)
                counts["merged"] += 1
            else:
                counts["duplicates"] += 1
    return counts


def _append_ledger(store: Store, memory_id: int, rows: list[dict[str, Any]],
                   start: tuple[float, float, str] | None = None) -> float:
    """Append ledger rows (receipt links dropped: receipts stay in their own bank); return the last Q.

    With `start` = (current Q, incoming initial Q, source), a `set` row first moves Q to the
    incoming chain's start so that every row's q_before follows from the one before.
    """
    if start is not None and rows:
        rows = [{"kind": "set", "q_before": start[0], "q_after": start[1], "created_at": now(),
                 "source": f"merge: start of ledger from {start[2]}"}] + rows
    store.append_ledger(memory_id, [{**r, "retrieval_id": None, "created_at": r.get("created_at") or now()}
                                    for r in rows])
    last = rows[-1]["q_after"] if rows else (start[0] if start else None)
    return float(last) if last is not None else 0.0


def _append_quarantine_log(store: Store, memory_id: int, rows: list[dict[str, Any]], quarantined_at: str | None,
                           source_name: str, stamp: str) -> None:
    """Append an incoming quarantine log and set the memory's state from it. A memory quarantined on
    either side stays quarantined (a `quarantine` row says so when the incoming log ends in a release)."""
    store.log_quarantine([(memory_id, r["action"], r.get("reason"), r.get("actor"), r["created_at"]) for r in rows])
    if rows and rows[-1]["action"] == "quarantine":
        store.set_quarantined([memory_id], quarantined_at or rows[-1]["created_at"])
    elif rows and quarantined_at is not None:
        store.log_quarantine([(memory_id, "quarantine", f"merge: quarantined in this bank, released in {source_name}",
                               None, stamp)])


def backup(bank: MemoryBank, destination: str, overwrite: bool = False) -> int:
    """A consistent copy of a SQLite bank while others may be writing (SQLite's online backup); bytes written."""
    bank.store.backup(destination, overwrite)
    return os.path.getsize(destination)


def merge(first: str, second: str, output: str, progress: Progress | None = None) -> dict[str, int]:
    """`output` = `first` plus `second`: duplicates reconciled by visit-weighted Q, both ledgers kept.

    Any of the three may be a PostgreSQL URL. Between SQLite files the output starts as a copy of
    `first` (receipts and runs included); otherwise it must be an empty bank and receives `first`'s
    memories with their ledgers, then `second`'s, in one transaction.
    """
    for location in (first, second):
        if not is_server_url(location) and not os.path.isfile(location):
            raise MemrlError(f"no bank at {location}")
    if not is_server_url(output) and os.path.exists(output):
        raise MemrlError(f"{output} exists; merge writes a new bank")
    with MemoryBank(first, create=False) as a, MemoryBank(second, create=False) as b:
        ours, theirs = a.meta("embedder"), b.meta("embedder")
        if theirs and ours and (theirs["spec"], theirs["dim"]) != (ours["spec"], ours["dim"]):
            raise MemrlError(f"cannot merge banks made with different embedders ({ours['spec']} vs {theirs['spec']}); "
                             "export one and import it into the other to re-embed")
        records = list(_stored_records(b))
        name = os.path.basename(second) if not is_server_url(second) else b.path
        if is_server_url(output) or a.is_server:
            return _merge_into(output, a, records, theirs, name, progress)
        with _staged(output) as staging:
            backup(a, staging)
            with MemoryBank(staging, create=False) as out:
                return import_records(out, records, theirs, progress, merge_duplicates=True, source_name=name)


@contextmanager
def _staged(output: str) -> Iterator[str]:
    """Where to write a new bank: for a file, a staging file renamed to `output` only when the block
    succeeds (and removed otherwise); a server URL as it is."""
    if is_server_url(output):
        yield output
        return
    staging = f"{output}.partial-{os.getpid()}"
    try:
        yield staging
        os.replace(staging, output)
    finally:
        for leftover in (staging, f"{staging}-wal", f"{staging}-shm"):
            if os.path.exists(leftover):
                os.remove(leftover)


def _merge_into(output: str, first: MemoryBank, records: list[tuple[MemoryInput, dict[str, Any]]],
                embedder: dict[str, Any] | None, name: str, progress: Progress | None) -> dict[str, int]:
    """Merge into a new (empty) bank of any engine: `first`'s memories, then `records`, atomically."""
    with _staged(output) as location, \
            MemoryBank(location, embedder=(first.meta("embedder") or {}).get("spec")) as out:
        if out.count():
            raise MemrlError(f"{out.path} already holds memories; merge writes a new bank")
        with out.transaction():
            import_records(out, list(_stored_records(first)), first.meta("embedder"), progress)
            return import_records(out, records, embedder, progress, merge_duplicates=True, source_name=name)


def _stored_records(bank: MemoryBank) -> Iterable[tuple[MemoryInput, dict[str, Any]]]:
    """A bank's memories as import records (with vectors and ledgers), via the export format."""
    import io

    buffer = io.StringIO()
    export_jsonl(bank, buffer, vectors=True)
    lines = buffer.getvalue().splitlines()[1:]
    for number, line in enumerate(lines, start=2):
        yield _parse_stored(json.loads(line), f"{bank.path} memory {number - 1}: ")
