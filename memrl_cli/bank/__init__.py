"""`MemoryBank` (`memory_bank`) and its parts, each usable and tested alone over a Store: validated
memories (`records`), transactions and caches (`connection`), embedders (`embedders`) and the bank's
vectors (`vectors`), Phase-A search (`search_index`), the z-score statistics (`calibration`), writing
memories (`writer`), retrieval with its receipt (`retriever`), rewards and their ledger (`ledger`)."""

from memrl_cli.bank.memory_bank import MemoryBank
from memrl_cli.bank.records import IngestResult, MemoryInput
from memrl_cli.bank.retriever import Retrieval

__all__ = ["IngestResult", "MemoryBank", "MemoryInput", "Retrieval"]
