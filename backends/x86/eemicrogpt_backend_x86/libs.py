"""Where the built libraries are, and the extras they export beyond the eemicrogpt ABI."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import cffi

from eemicrogpt_core.backends.native import find_library

PACKAGE_DIR = Path(__file__).resolve().parent
# A directory holding alternative builds (e.g. the ASan/UBSan libraries of tests/run_sanitized.sh).
LIB_DIR_ENV = "EEMICROGPT_X86_LIB_DIR"

_EXTRAS_CDEF = """
double emg_x86_peak_gflops(double seconds);
double emg_x86_bf16_peak_gflops(double seconds); /* the bf16 libraries only */
double emg_x86_amx_peak_gflops(double seconds); /* the amx_bf16 library only */
void emg_x86_exp(const float *x, float *y, int n);
int emg_x86_cpu_features(void);
"""


def library_dir() -> Path:
    override = os.environ.get(LIB_DIR_ENV)
    return Path(override) if override else PACKAGE_DIR


def library_path(stem: str) -> Path | None:
    """The library `_emg_<stem>` (a variant's name, or probe), or None when it was not built."""
    return find_library(library_dir(), f"_emg_{stem}")


@functools.cache
def _ffi() -> cffi.FFI:
    ffi = cffi.FFI()
    ffi.cdef(_EXTRAS_CDEF)
    return ffi


@functools.cache
def _open(path: str):
    return _ffi().dlopen(path)


def extras(stem: str):
    """(ffi, lib) for the x86-specific exports of library `stem`; raises when it was not built."""
    path = library_path(stem)
    if path is None:
        raise FileNotFoundError(f"the x86 backend library _emg_{stem} is not built in {library_dir()}")
    return _ffi(), _open(str(path))
