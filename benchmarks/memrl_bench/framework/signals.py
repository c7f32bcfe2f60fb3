"""Stopping a run: SIGTERM and SIGHUP unwind like Ctrl-C, so every process a run started is stopped.

Python's default SIGTERM kills the process on the spot: no `finally`, no context manager, and
the local model server and episode workers it started live on, adopted by PID 1.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextmanager
def interrupt_on_termination() -> Iterator[None]:
    """Within the block, the first SIGTERM or SIGHUP raises KeyboardInterrupt (as Ctrl-C does); later
    ones are ignored until the block has cleaned up. Only the main thread can set handlers: elsewhere
    this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        for stop in STOP_SIGNALS:
            signal.signal(stop, signal.SIG_IGN)
        raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")

    previous = {stop: signal.signal(stop, interrupt) for stop in STOP_SIGNALS}
    try:
        yield
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)
