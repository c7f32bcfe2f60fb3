"""Operations over a bank, each a module of plain functions over a `MemoryBank`: hygiene
(quarantine, release, reset-q, undo), read-only views and verify (`inspection`), the everyday
operations (`memories`), moving banks (`transfer`), benchmark runs recorded in a bank (`runs`) and
their learning report (`report`, drawn by `report_plot`)."""
