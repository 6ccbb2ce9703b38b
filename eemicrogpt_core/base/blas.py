"""One BLAS thread for a while: numpy's OpenBLAS, found among the loaded libraries and asked directly.

Generation multiplies small matrices (one position, or one window of at most 64): splitting them across
threads gains nothing, and on a machine whose cores are busy OpenBLAS's spinning threads made a d128 window
over a hundred times slower. Environment variables cannot help once numpy is loaded, so the thread count is
set through OpenBLAS's own functions (`openblas_set_num_threads`, under the names numpy's builds export) and
restored afterwards. Where no OpenBLAS is found (another BLAS, another OS) nothing changes.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# The names OpenBLAS builds give these functions: plain, numpy/scipy's wheels' "scipy_" prefix, 64-bit ints.
_PREFIXES = ("", "scipy_")
_SUFFIXES = ("", "64_")


def _loaded_openblas() -> list[str]:
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    return sorted({line.split()[-1] for line in maps.splitlines() if "openblas" in line.rsplit("/", 1)[-1].lower()})


@functools.cache
def _controls() -> tuple[tuple[Any, Any], ...]:
    """(get, set) of every loaded OpenBLAS's thread count."""
    found = []
    for path in _loaded_openblas():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in _PREFIXES:
            for suffix in _SUFFIXES:
                get = getattr(lib, f"{prefix}openblas_get_num_threads{suffix}", None)
                put = getattr(lib, f"{prefix}openblas_set_num_threads{suffix}", None)
                if get is not None and put is not None:
                    get.restype, put.argtypes = ctypes.c_int, [ctypes.c_int]
                    found.append((get, put))
    return tuple(found)


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run the block with numpy's BLAS on one thread, then give back the count it had."""
    before = [(get(), put) for get, put in _controls()]
    for _, put in before:
        put(1)
    try:
        yield
    finally:
        for count, put in before:
            put(count)


def blas_threads() -> list[int]:
    """The thread count of every OpenBLAS found (empty when none is)."""
    return [get() for get, _ in _controls()]
