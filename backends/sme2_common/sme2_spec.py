"""The BackendSpec of an SME2 backend: one definition for sme2_f32 and sme2_f16 (same shapes, same ABI)."""

from __future__ import annotations

from pathlib import Path

from eemicrogpt_core.backend import BackendSession, BackendSpec, ProbeResult
from eemicrogpt_core.model import ModelShape
from eemicrogpt_core.native import (
    MAX_BATCH,
    find_library,
    library_load_error,
    library_supports,
    native_session_factory,
    not_built_reason,
)

from . import probe

# The shapes are declared once, by supports() in sme2_common/sme2_step.c; the spec asks the library, and
# ENVELOPE says the same in words for `eemicrogpt backends`.
ENVELOPE = "d_model 64-256 in steps of 16, any heads with head_dim >= 4, vocabulary 2-256, context 1-64, 1-8 layers"


def sme2_spec(
    name: str, description: str, package_dir: Path, stem: str, f16f16: bool, score: int, precision: str = "fp32"
) -> BackendSpec:
    """A spec whose probe checks the CPU (and the built library) and whose factory opens the library."""

    def library() -> Path | None:
        return find_library(package_dir, stem)

    def probe_backend() -> ProbeResult:
        reason = probe.unavailable_reason(name, f16f16)
        if reason is not None:
            return ProbeResult.no(reason)
        path = library()
        if path is None:
            return ProbeResult.no(not_built_reason(package_dir, stem) or (
                f"{name}: the kernels library {stem}.so was not built into {package_dir} "
                f"(reinstall it from source on this machine with clang >= 19, or run the aarch64 lane)"
            ))
        if (error := library_load_error(path)) is not None:
            return ProbeResult.no(f"{name}: {error}")
        note = f"SME2{' + FEAT_SME_F16F16' if f16f16 else ''}, {probe.streaming_vector_bits()}-bit streaming vectors"
        return ProbeResult.ok(score, note)

    def factory(shape: ModelShape, max_batch: int, dtype: str) -> BackendSession:
        path = library()
        if path is None:
            raise RuntimeError(f"{name}: the kernels library {stem} is missing from {package_dir}")
        return native_session_factory(path)(shape, max_batch, dtype)

    return BackendSpec(
        name=name,
        description=description,
        probe=probe_backend,
        factory=factory,
        supports=library_supports(library),
        dtypes=("float32",),
        max_batch=MAX_BATCH,
        precision=precision,
        envelope=ENVELOPE,
    )
