"""The size cap on what an environment or an agent's answer puts into a prompt and a memory.

In runtime RL every observation goes into the next prompt and, once the episode is stored,
into the bank. An agent controls how large some of them are (a query returning 100 MB, a
command printing without end), so each adapter passes them through `cap` before they reach
either: at most `MAX_OBSERVATION_BYTES` of UTF-8, the cut marked with its sizes.
"""

from __future__ import annotations

MAX_OBSERVATION_BYTES = 16 * 1024  # 16 KiB per observation (or answer), marker excluded


def cut_marker(total: int, kept: int) -> str:
    """The mark left where `cap` cut: the original size and the size kept, in bytes of UTF-8."""
    return f"…[cut: {total} bytes, kept {kept}]"


def cap(text: str, limit: int = MAX_OBSERVATION_BYTES, tail: int = 0) -> str:
    """`text` unchanged if it is at most `limit` bytes of UTF-8; else `limit` bytes of it (never
    half a character) with `cut_marker` where the cut is: at the end, or, with `tail`, before
    the last `tail` bytes (an answer's final line survives a long explanation)."""
    if len(text) * 4 <= limit:  # a character is at most 4 bytes: short texts need no encoding
        return text
    data = text.encode("utf-8", errors="surrogatepass")
    if len(data) <= limit:
        return text
    tail = min(max(tail, 0), limit)
    head = data[:limit - tail].decode("utf-8", errors="ignore")
    end = data[len(data) - tail:].decode("utf-8", errors="ignore") if tail else ""
    kept = len(head.encode("utf-8", errors="surrogatepass")) + len(end.encode("utf-8", errors="surrogatepass"))
    return head + cut_marker(len(data), kept) + end
