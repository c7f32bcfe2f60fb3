"""Where a bank lives, and the only SQL: the `Store` interface (`base`) with its named queries
(`views`, `repairs`, `runs`), the SQLite store (`sqlite`, over `sqlite_driver` and `sqlite_schema`),
the PostgreSQL store (`postgres`, over `postgres_driver`), and the numbered migrations of both
(`migrations`). Nothing outside this package runs SQL on a bank or names an engine."""

from memrl_cli.store.base import (INDEX_NAMES, Store, check_index_change, is_server_url, open_store,
                                  redact)

__all__ = ["INDEX_NAMES", "Store", "check_index_change", "is_server_url", "open_store", "redact"]
