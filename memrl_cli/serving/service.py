"""A bank served to other programs (`memrl mcp`, `memrl proxy`): the learning operations with the
CLI's `--json` answers, and a pool of bank connections for worker threads (the network rules are
`memrl_cli.serving.network`).

`--read-only` turns off the operations that change what is learned (reward, remember): callers can
still retrieve, and each retrieval still stores its receipt, so a trusted harness can reward it
later through the CLI or the library. Whoever rewards, the reward must lie in the bank's reward
range ([-1, 1] unless `memrl config reward_range` widens it); the MCP tools' learning rate is the
server's (`memrl mcp --alpha`), and their results never say where the bank is.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlsplit

from memrl_cli.bank.ledger import in_scope
from memrl_cli.bank.memory_bank import MemoryBank, Retrieval
from memrl_cli.bank.records import check_scope, now
from memrl_cli.errors import MemrlError
from memrl_cli.method.retrieval import RetrieveParams
from memrl_cli.store.base import is_server_url


BANK_WAIT = 2.0  # seconds a server's call waits for a bank another process holds (`--bank-wait`)


def check_wait(seconds: float) -> None:
    """Refuse a bank wait that is not a number of seconds in (0, 60]."""
    if not 0 < seconds <= 60:
        raise MemrlError(f"--bank-wait must be a number of seconds in (0, 60], got {seconds:g}")


class ReadOnlyError(MemrlError):
    """A learning operation asked of a server started with `--read-only`."""


class BankPool:
    """Bank connections for concurrent requests: each call borrows one (opening another when all
    are busy) and gives it back, so threads never share a connection. `busy_timeout`: how long a
    statement waits for another writer's lock (`MemoryBank`)."""

    def __init__(self, location: str, busy_timeout: float | None = None) -> None:
        self.location = location
        self.busy_timeout = busy_timeout
        first = MemoryBank(location, busy_timeout=busy_timeout)  # fail fast on a bad --db; creates a new bank
        for warning in first.warnings:
            sys.stderr.write(f"memrl: warning: {warning}\n")
        self._free = [first]
        self._lock = threading.Lock()

    @contextmanager
    def bank(self) -> Iterator[MemoryBank]:
        """A bank for this call; a connection that failed with anything but a user error is dropped (a driver's
        error becomes the store's one-line MemrlError). An error's message never says where the bank is (`private`)."""
        with self._lock:
            bank = self._free.pop() if self._free else None
        try:
            if bank is None:
                bank = MemoryBank(self.location, create=False, busy_timeout=self.busy_timeout)
            yield bank
        except MemrlError as exc:
            if bank is not None:
                self._give_back(bank)
            raise private(exc, self.location) from None
        except BaseException as exc:
            if bank is not None:
                bank.close()
                if isinstance(exc, bank.store.errors):  # a driver's error (the connection may be gone): one line
                    raise private(bank.store.error(exc), self.location) from None
            raise
        self._give_back(bank)

    def _give_back(self, bank: MemoryBank) -> None:
        with self._lock:
            self._free.append(bank)

    def close(self) -> None:
        """Close every idle connection."""
        with self._lock:
            banks, self._free = self._free, []
        for bank in banks:
            bank.close()


def private(exc: MemrlError, location: str) -> MemrlError:
    """`exc` with a message that does not say where the bank is (a file path, a server URL): a server's callers
    are told "the bank"."""
    message = str(exc)
    folder = os.path.dirname(os.path.abspath(location))
    url = urlsplit(location) if is_server_url(location) else None
    quoted = [(f'"{url.path.lstrip("/")}"', "the bank's database"), (f'"{url.hostname}"', "the bank's server")] \
        if url is not None else []  # as the PostgreSQL driver names them
    for said, instead in ((f"the PostgreSQL bank {location}", "the PostgreSQL bank"), (f"the bank {location}", "the bank"),
                          (f"the database of {location}", "the bank's database"), (location, "the bank"),
                          (os.path.abspath(location), "the bank"), (folder, "the bank's directory"), *quoted):
        message = message.replace(said, instead) if len(said) > 2 else message  # (never "/" nor '""')
    exc.args = (message,)
    return exc


class BankService:
    """The operations both servers offer, each answering exactly what the matching CLI command
    prints with `--json` (JSON-safe: through the same encoder), or raising MemrlError.

    `scope` is the server's default scope (`--scope`): a call that names none acts in it, and without one in
    no scope. A call acts in its scope alone: it retrieves and lists only the memories of that scope (none:
    only the memories without a scope), tags what it writes with it, and rewards only its receipts and
    memories. `busy_timeout`: how long a call waits for a bank another process holds (`BankPool`)."""

    def __init__(self, location: str, read_only: bool = False, selector: str = "memrl", scope: str | None = None,
                 busy_timeout: float | None = None) -> None:
        self.selector = RetrieveParams(selector=selector).selector  # checked now, not at the first retrieve
        self.scope = check_scope(scope, "--scope: ")
        self.pool = BankPool(location, busy_timeout)
        self.read_only = read_only

    def close(self) -> None:
        """Close the bank connections."""
        self.pool.close()

    def _learning(self, what: str) -> None:
        if self.read_only:
            raise ReadOnlyError(f"this server is read-only: {what} is turned off")

    def scope_of(self, scope: str | None) -> str | None:
        """The scope a call acts in: the one it names (checked), else the server's."""
        return self.scope if scope is None else check_scope(scope)

    def retrieve(self, query: str, k1: int = 5, k2: int = 3, lam: float = 0.5, threshold: float = 0.5,
                 task_id: str | None = None, scope: str | None = None) -> dict[str, Any]:
        """`memrl retrieve QUERY --json`: the selected memories and the receipt id to reward (with the
        service's selector), among the memories of the call's scope; the receipt keeps `task_id` and the scope."""
        scope = self.scope_of(scope)
        params = RetrieveParams(k1=k1, k2=k2, lam=lam, threshold=threshold, selector=self.selector, scopes=(scope,))
        with self.pool.bank() as bank:
            return as_json(bank.retrieve(query, params, task_id=task_id, scope=scope).to_dict())

    def warm(self) -> None:
        """Load the bank's local embedding model now, so that the first request does not wait for it (a
        remote or external embedder is left alone)."""
        with self.pool.bank() as bank:
            if (bank.meta("embedder") or {}).get("spec", "local") == "local":
                bank.embedder.embed(["warm-up"])

    def select(self, query: str, params: RetrieveParams, task_id: str | None = None,
               scope: str | None = None) -> Retrieval:
        """A retrieval among the memories of `scope` whose receipt is not stored yet (see `record`)."""
        with self.pool.bank() as bank:
            return bank.retrieve(query, replace(params, scopes=(scope,)), record=False, task_id=task_id, scope=scope)

    def record(self, retrieval: Retrieval, task: tuple[str, int] | None = None, expiry: float = 0.0) -> int:
        """Store the receipt of a `select`, with `task` = (key, calls) as the open task it is (one write: see
        `memrl_cli.serving.proxy_tasks`), tasks unchanged for `expiry` seconds dropped; return its id."""
        with self.pool.bank() as bank, bank.transaction():
            rid = bank.record(retrieval)
            if task is not None:
                stamp = now()
                bank.store.open_task(task[0], rid, task[1], stamp)
                bank.store.prune_tasks(ago(expiry))
            return rid

    def open_tasks(self, keys: list[str], expiry: float) -> list[tuple[str, int, int]]:
        """(key, retrieval id, calls) of the open tasks under these keys, changed within `expiry` seconds."""
        with self.pool.bank() as bank:
            return bank.store.open_tasks(keys, ago(expiry))

    def recorded(self, retrieval_id: int) -> Retrieval:
        """A stored receipt read back (`MemoryBank.recorded`)."""
        with self.pool.bank() as bank:
            return bank.recorded(retrieval_id)

    def task_ended(self, retrieval_id: int) -> bool:
        """Whether the task of this receipt is over (rewarded)."""
        with self.pool.bank() as bank:
            return bank.store.task_ended(retrieval_id)

    def touch_tasks(self, rows: list[tuple[str, int, int]]) -> None:
        """Record (key, retrieval id, calls) of tasks that had a call now (one write)."""
        with self.pool.bank() as bank, bank.transaction():
            bank.store.touch_tasks(rows, now())

    def remember(self, intent: str, experience: str, outcome: str = "unknown", task_id: str | None = None,
                 source: str | None = None, scope: str | None = None) -> dict[str, Any]:
        """`memrl ingest --intent --experience --outcome --json`: {"id", "created"}, in the call's scope."""
        self._learning("remember")
        with self.pool.bank() as bank:
            result = bank.ingest(intent, experience, outcome, task_id=task_id, source=source,
                                 scope=self.scope_of(scope))
        return {"id": result.id, "created": result.created}

    def reward(self, requests: list[dict[str, Any]], scope: str | None = None) -> dict[str, Any]:
        """`memrl reward --json` (one request, or many in one transaction): {"updated": [...]}; each reward
        within the bank's reward range, acting in the call's scope (a request's own `scope` field, else `scope`,
        else the server's)."""
        self._learning("reward")
        scope = self.scope_of(scope)
        requests = [r if "scope" in r else {**r, "scope": scope} for r in requests]
        with self.pool.bank() as bank:
            return as_json({"updated": bank.reward_many(requests)})

    def top_memories(self, n: int = 10, scope: str | None = None) -> dict[str, Any]:
        """`memrl inspect --top-q N --json`, among the memories of the call's scope."""
        from memrl_cli.ops import inspection

        with self.pool.bank() as bank:
            return as_json({"memories": inspection.top_q(bank, n, (self.scope_of(scope),))})

    def explain(self, retrieval_id: int, scope: str | None = None) -> dict[str, Any]:
        """`memrl explain ID --json`, for a receipt of the call's scope."""
        from memrl_cli.ops import inspection

        scope = self.scope_of(scope)
        with self.pool.bank() as bank:
            found, receipt_scope = bank.store.receipt_scope(retrieval_id)
            if found and receipt_scope != scope:
                raise MemrlError(f"retrieval {retrieval_id} was retrieved {in_scope(receipt_scope)}, not "
                                 f"{in_scope(scope)}")
            return as_json(inspection.explain(bank, retrieval_id))

    def reward_range(self) -> tuple[float, float]:
        """The bank's reward range (see `MemoryBank.reward_range`)."""
        with self.pool.bank() as bank:
            return bank.reward_range()

    def stats(self) -> dict[str, Any]:
        """`memrl inspect --stats --json` without `path`: a server does not tell its callers where its bank is."""
        from memrl_cli.ops import inspection

        with self.pool.bank() as bank:
            data = inspection.stats(bank)
        del data["path"]
        return as_json(data)


def ago(seconds: float) -> str:
    """The time `seconds` ago, as the bank writes times."""
    return (datetime.now(timezone.utc) - timedelta(seconds=seconds)).isoformat(timespec="microseconds")


def as_json(data: Any) -> Any:
    """`data` as the CLI prints it (`json.dumps(..., default=str)`), decoded again."""
    return json.loads(json.dumps(data, ensure_ascii=False, default=str))
