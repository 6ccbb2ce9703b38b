"""Registers the neon backend with eemicrogpt (entry point group `eemicrogpt.backends`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from eemicrogpt_core.backend import BackendSession, BackendSpec, ProbeResult
from eemicrogpt_core.hookspec import hookimpl
from eemicrogpt_core.model import ModelShape
from eemicrogpt_core.native import find_library, library_load_error, native_session_factory, not_built_reason

from . import probe

PACKAGE_DIR = Path(__file__).resolve().parent
LIBRARY_STEM = "_neon_kernels"
# (d_model, n_heads) pairs with a compiled kernel: must match KERNELS in csrc/abi.c.
SHAPES = ((16, 4), (32, 4), (64, 4), (128, 4), (128, 8))
MAX_BATCH = 256
# Above numpy_ref (1); SIMD matrix backends (SME2) should score higher where they support the shape.
SCORE = 10


@dataclass(frozen=True)
class NeonSpec(BackendSpec):
    """BackendSpec whose shape check knows that 8 heads exist only at d_model 128."""

    def unsupported_reason(self, shape: ModelShape, batch: int, dtype: str = "float32") -> str | None:
        reason = super().unsupported_reason(shape, batch, dtype)
        if reason is None and (shape.d_model, shape.n_heads) not in SHAPES:
            pairs = ", ".join(f"{d}/{h}" for d, h in SHAPES)
            return f"neon supports d_model/n_heads {pairs}, not {shape.d_model}/{shape.n_heads}"
        return reason


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
    if (shape.d_model, shape.n_heads) not in SHAPES:
        raise ValueError(f"neon has no kernel for d_model {shape.d_model} with {shape.n_heads} heads")
    return native_session_factory(path)(shape, max_batch, dtype)


@hookimpl
def eemicrogpt_backends() -> Iterator[BackendSpec]:
    yield NeonSpec(
        name="neon",
        description="ARM Advanced SIMD C: the whole step (forward, backward, Adam) in one native call",
        probe=_probe,
        factory=_factory,
        d_models=tuple(sorted({d for d, _ in SHAPES})),
        n_heads=tuple(sorted({h for _, h in SHAPES})),
        dtypes=("float32",),
        max_batch=MAX_BATCH,
    )
