"""Ctrl-C between chunks: the first SIGINT asks the loop to stop at the next chunk boundary (where the
state is consistent and can be saved); a second one interrupts at once."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType


class StopFlag:
    def __init__(self) -> None:
        self.requested = False


@contextmanager
def deferred_sigint(on_first: Callable[[], None] = lambda: None) -> Iterator[StopFlag]:
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag  # signal handlers can only be installed from the main thread
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if flag.requested:
            raise KeyboardInterrupt
        flag.requested = True
        on_first()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)
