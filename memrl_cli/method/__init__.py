"""The method, pure: two-phase retrieval and its scoring (`retrieval`), the Q rule and its replay
(`learning`), and the in-process Phase-A index over a matrix of vectors (`matrix_index`). No I/O, no
bank, no Store: everything here is a function of its arguments (docs/method.md)."""
