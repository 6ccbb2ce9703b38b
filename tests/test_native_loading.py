"""Loading native libraries from several threads at once (probes run in worker threads): one FFI instance."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import cffi
import pytest

from eemicrogpt_core.backends import native


class SlowFFI(cffi.FFI):
    """Widens the window in which two first calls could each build an FFI."""

    def __init__(self) -> None:
        time.sleep(0.05)
        super().__init__()


def test_concurrent_first_calls_share_one_ffi(monkeypatch: pytest.MonkeyPatch) -> None:
    native._build_ffi.cache_clear()
    native._load_library.cache_clear()
    monkeypatch.setattr(native.cffi, "FFI", SlowFFI)
    start = threading.Barrier(8)

    def first_call(_: int) -> cffi.FFI:
        start.wait()
        return native._ffi()

    try:
        with ThreadPoolExecutor(8) as pool:
            instances = list(pool.map(first_call, range(8)))
    finally:
        native._build_ffi.cache_clear()
        native._load_library.cache_clear()
    assert all(ffi is instances[0] for ffi in instances)
