"""Registers the neon backend with eemicrogpt (entry point group `eemicrogpt.backends`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from eemicrogpt_core.backends.backend import BackendSession, BackendSpec, ProbeResult
from eemicrogpt_core.backends.hookspec import hookimpl
from eemicrogpt_core.backends.native import (
    find_library,
    library_load_error,
    library_supports,
    native_session_factory,
    not_built_reason,
)
from eemicrogpt_core.base.abi import MAX_NATIVE_BATCH
from eemicrogpt_core.model.shape import ModelShape

from . import probe

PACKAGE_DIR = Path(__file__).resolve().parent
LIBRARY_STEM = "_neon_kernels"
# Above numpy_ref (1); SIMD matrix backends (SME2) should score higher where they support the shape.
SCORE = 10
BLOCK_ROWS = 64  # csrc/session.h NEON_BLOCK_ROWS: a block holds this many packed rows, or one longer sequence


def library_path() -> Path | None:
    return find_library(PACKAGE_DIR, LIBRARY_STEM)


def _probe() -> ProbeResult:
    reason = probe.unavailable_reason()
    if reason is not None:
        return ProbeResult.no(reason)
    path = library_path()
    if path is None:
        why = not_built_reason(PACKAGE_DIR, LIBRARY_STEM)
        return ProbeResult.no(why or (
            f"neon: the kernels library {LIBRARY_STEM}.so was not built into {PACKAGE_DIR} "
            "(reinstall eemicrogpt-backend-neon from source on this machine)"
        ))
    if (error := library_load_error(path)) is not None:
        return ProbeResult.no(f"neon: {error}")
    return ProbeResult.ok(SCORE, "Advanced SIMD detected")


def _factory(shape: ModelShape, max_batch: int, dtype: str) -> BackendSession:
    path = library_path()
    if path is None:
        raise RuntimeError(f"neon: the kernels library {LIBRARY_STEM} is missing from {PACKAGE_DIR}")
    return native_session_factory(path)(shape, max_batch, dtype)


@hookimpl
def eemicrogpt_backends() -> Iterator[BackendSpec]:
    yield BackendSpec(
        name="neon",
        description="ARM Advanced SIMD C: the whole step (forward, backward, Adam) in one native call",
        probe=_probe,
        factory=_factory,
        supports=library_supports(library_path),  # csrc/abi.c: supports()
        dtypes=("float32",),
        max_batch=MAX_NATIVE_BATCH,
        block_rows=BLOCK_ROWS,
        envelope=("d16-1024 step 16 (compiled per width to 256), head_dim a multiple of 4, 1-12 layers, "
                  "vocabulary 2-256, context 1-256"),
    )
