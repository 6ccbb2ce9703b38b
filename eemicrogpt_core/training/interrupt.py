"""Ctrl-C, SIGTERM and SIGHUP between chunks: the first signal asks the loop to stop at the next chunk boundary
(where the state is consistent and can be saved); a second one interrupts at once.

A signal the parent process set to SIG_IGN (`nohup` ignores SIGHUP, some job runners SIGINT) stays ignored:
the user asked for the run to survive it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class StopFlag:
    def __init__(self) -> None:
        self.signum: int | None = None  # the first stop signal received

    @property
    def requested(self) -> bool:
        return self.signum is not None


def signal_name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


@contextmanager
def deferred_stop(on_first: Callable[[int], None] = lambda signum: None) -> Iterator[StopFlag]:
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag  # signal handlers can only be installed from the main thread
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if flag.requested:
            raise KeyboardInterrupt
        flag.signum = signum
        on_first(signum)

    previous: dict[int, object] = {}
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, handler)
    try:
        yield flag
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old if old is not None else signal.SIG_DFL)  # type: ignore[arg-type]
