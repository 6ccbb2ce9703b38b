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
        self.last: int | None = None  # the latest (stop_signals_raise_interrupt)

    @property
    def requested(self) -> bool:
        return self.signum is not None


def signal_name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


@contextmanager
def _handling_stop_signals(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """handler for every stop signal not inherited as SIG_IGN, the previous handlers restored afterwards;
    nothing outside the main thread (only it may install handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, object] = {}
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old if old is not None else signal.SIG_DFL)  # type: ignore[arg-type]


@contextmanager
def deferred_stop(on_first: Callable[[int], None] = lambda signum: None) -> Iterator[StopFlag]:
    flag = StopFlag()

    def handler(signum: int, frame: FrameType | None) -> None:
        if flag.requested:
            raise KeyboardInterrupt
        flag.signum = signum
        on_first(signum)

    with _handling_stop_signals(handler):
        yield flag


@contextmanager
def stop_signals_raise_interrupt() -> Iterator[StopFlag]:
    """SIGTERM and SIGHUP, like Ctrl-C, raise KeyboardInterrupt in the main thread (their default would end the
    process at once, with no chance to stop its children or record their results); the flag keeps the first
    signal received (for the exit status) and the last (to pass on). Signals inherited as SIG_IGN stay ignored."""
    flag = StopFlag()

    def handler(signum: int, frame: FrameType | None) -> None:
        if flag.signum is None:
            flag.signum = signum
        flag.last = signum
        raise KeyboardInterrupt

    with _handling_stop_signals(handler):
        yield flag
