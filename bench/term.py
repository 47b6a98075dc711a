"""A bench run ended by SIGTERM (`timeout`, a supervisor, CI) unwinds as Ctrl-C does: its `finally` blocks stop the
embedded Redis, the stand-in servers and the fleet processes it started and remove its temporary folders. Under
the default SIGTERM they stayed behind (a `timeout` of `prewarm bench router` left its redis-server running)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


def _unwind(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """While inside, SIGTERM raises SystemExit(143) in the main thread; the earlier handler is back afterwards (a
    test calling a bench command keeps its own). Off the main thread, where no handler can be set, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, _unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if old is None else old)  # None: set outside Python
