"""memrl: runtime reinforcement learning on an LLM agent's episodic memory, in one SQLite file.

    from memrl_cli import MemoryBank, RetrieveParams

    bank = MemoryBank("memrl.db")
    bank.ingest("heat an apple", "SCRIPT: take apple, go to microwave, heat", "success")
    hit = bank.retrieve("warm up an apple", RetrieveParams(k1=5, k2=3, lam=0.5))
    bank.reward(1.0, retrieval_id=hit.id)

Names are imported lazily so that `memrl --help` and light commands start fast.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["MemoryBank", "RetrieveParams", "Retrieval", "IngestResult", "MemrlError", "__version__"]

_WHERE = {"MemoryBank": "memrl_cli.bank", "Retrieval": "memrl_cli.bank", "IngestResult": "memrl_cli.bank",
          "RetrieveParams": "memrl_cli.method.retrieval", "MemrlError": "memrl_cli.errors"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'memrl_cli' has no attribute {name!r}")
