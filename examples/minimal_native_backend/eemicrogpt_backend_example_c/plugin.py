"""Registers example_c with eemicrogpt (entry point group `eemicrogpt.backends`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from eemicrogpt_core.backends.backend import BackendSession, BackendSpec, ProbeResult
from eemicrogpt_core.backends.hookspec import hookimpl
from eemicrogpt_core.backends.native import find_library, library_supports, native_session_factory
from eemicrogpt_core.base.abi import MAX_NATIVE_BATCH
from eemicrogpt_core.model.shape import ModelShape

PACKAGE_DIR = Path(__file__).resolve().parent
LIBRARY_STEM = "_example_c"


def _library() -> Path | None:
    return find_library(PACKAGE_DIR, LIBRARY_STEM)


def _probe() -> ProbeResult:
    # Portable C runs on any CPU: the only way to be unavailable is a missing build.
    if _library() is None:
        return ProbeResult.no(f"example_c: {LIBRARY_STEM} was not built into {PACKAGE_DIR}")
    return ProbeResult.ok(0, "portable C; never chosen by auto (score 0)")


def _factory(shape: ModelShape, max_batch: int, dtype: str) -> BackendSession:
    path = _library()
    if path is None:
        raise RuntimeError(f"example_c: {LIBRARY_STEM} is missing from {PACKAGE_DIR}")
    return native_session_factory(path)(shape, max_batch, dtype)


@hookimpl
def eemicrogpt_backends() -> Iterator[BackendSpec]:
    yield BackendSpec(
        name="example_c",
        description="minimal portable C example built against eemicrogpt.h alone (every model shape)",
        probe=_probe,
        factory=_factory,
        supports=library_supports(_library),  # the shapes are the C library's emg_supports
        max_batch=MAX_NATIVE_BATCH,
        envelope="any valid shape",
    )
