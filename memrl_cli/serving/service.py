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
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from memrl_cli.bank.memory_bank import MemoryBank, Retrieval
from memrl_cli.errors import MemrlError
from memrl_cli.method.retrieval import RetrieveParams


class ReadOnlyError(MemrlError):
    """A learning operation asked of a server started with `--read-only`."""


class BankPool:
    """Bank connections for concurrent requests: each call borrows one (opening another when all
    are busy) and gives it back, so threads never share a connection."""

    def __init__(self, location: str) -> None:
        self.location = location
        first = MemoryBank(location)  # fail fast on a bad --db; creates a new bank as `ingest` would
        for warning in first.warnings:
            sys.stderr.write(f"memrl: warning: {warning}\n")
        self._free = [first]
        self._lock = threading.Lock()

    @contextmanager
    def bank(self) -> Iterator[MemoryBank]:
        """A bank for this call; a connection that failed with anything but a user error is dropped."""
        with self._lock:
            bank = self._free.pop() if self._free else None
        if bank is None:
            bank = MemoryBank(self.location, create=False)
        try:
            yield bank
        except MemrlError:
            self._give_back(bank)
            raise
        except BaseException:
            bank.close()
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


class BankService:
    """The operations both servers offer, each answering exactly what the matching CLI command
    prints with `--json` (JSON-safe: through the same encoder), or raising MemrlError."""

    def __init__(self, location: str, read_only: bool = False, selector: str = "memrl") -> None:
        self.selector = RetrieveParams(selector=selector).selector  # checked now, not at the first retrieve
        self.pool = BankPool(location)
        self.read_only = read_only

    def close(self) -> None:
        """Close the bank connections."""
        self.pool.close()

    def _learning(self, what: str) -> None:
        if self.read_only:
            raise ReadOnlyError(f"this server is read-only: {what} is turned off")

    def retrieve(self, query: str, k1: int = 5, k2: int = 3, lam: float = 0.5, threshold: float = 0.5) -> dict[str, Any]:
        """`memrl retrieve QUERY --json`: the selected memories and the receipt id to reward (with the
        service's selector)."""
        params = RetrieveParams(k1=k1, k2=k2, lam=lam, threshold=threshold, selector=self.selector)
        with self.pool.bank() as bank:
            return as_json(bank.retrieve(query, params).to_dict())

    def warm(self) -> None:
        """Load the bank's local embedding model now, so that the first request does not wait for it (a
        remote or external embedder is left alone)."""
        with self.pool.bank() as bank:
            if (bank.meta("embedder") or {}).get("spec", "local") == "local":
                bank.embedder.embed(["warm-up"])

    def select(self, query: str, params: RetrieveParams) -> Retrieval:
        """A retrieval whose receipt is not stored yet (see `record`)."""
        with self.pool.bank() as bank:
            return bank.retrieve(query, params, record=False)

    def record(self, retrieval: Retrieval) -> int:
        """Store the receipt of a `select`; return its id."""
        with self.pool.bank() as bank:
            return bank.record(retrieval)

    def remember(self, intent: str, experience: str, outcome: str = "unknown", task_id: str | None = None,
                 source: str | None = None) -> dict[str, Any]:
        """`memrl ingest --intent --experience --outcome --json`: {"id", "created"}."""
        self._learning("remember")
        with self.pool.bank() as bank:
            result = bank.ingest(intent, experience, outcome, task_id=task_id, source=source)
        return {"id": result.id, "created": result.created}

    def reward(self, requests: list[dict[str, Any]]) -> dict[str, Any]:
        """`memrl reward --json` (one request, or many in one transaction): {"updated": [...]}; each reward
        within the bank's reward range."""
        self._learning("reward")
        with self.pool.bank() as bank:
            return as_json({"updated": bank.reward_many(requests)})

    def top_memories(self, n: int = 10) -> dict[str, Any]:
        """`memrl inspect --top-q N --json`."""
        from memrl_cli.ops import inspection

        with self.pool.bank() as bank:
            return as_json({"memories": inspection.top_q(bank, n)})

    def explain(self, retrieval_id: int) -> dict[str, Any]:
        """`memrl explain ID --json`."""
        from memrl_cli.ops import inspection

        with self.pool.bank() as bank:
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


def as_json(data: Any) -> Any:
    """`data` as the CLI prints it (`json.dumps(..., default=str)`), decoded again."""
    return json.loads(json.dumps(data, ensure_ascii=False, default=str))
