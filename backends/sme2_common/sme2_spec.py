"""The SME2 backends (sme2_f32, sme2_f16, sme2_f16w): what each is, its BackendSpec and its plugin object.

One definition for the three (same kernels source, same shapes, same ABI). Copied by setup.py into the
package of each distribution that ships one of them (eemicrogpt_backend_sme2, eemicrogpt_backend_sme2_f16)
as `spec.py`, beside `probe.py`; that package's plugin.py names the backends it registers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
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

# The shapes are declared once, by supports() in sme2_common/sme2_step.c; the spec asks the library, and
# ENVELOPE says the same in words for `eemicrogpt backends`.
ENVELOPE = "d_model 64-1024 in steps of 16, any heads with head_dim >= 4, vocabulary 2-256, context 1-256, 1-12 layers"


@dataclass(frozen=True)
class Sme2Backend:
    """One build of the shared kernels (sme2_common/sme2_setup.py's VARIANTS) and how `auto` ranks it."""

    name: str
    stem: str  # the library's file name stem (the module setup.py builds in the package)
    description: str
    f16f16: bool  # needs FEAT_SME_F16F16 (the non-widening fp16 FMOPA)
    score: int
    precision: str = "fp32"


BACKENDS = {backend.name: backend for backend in (
    # Above neon (10) and numpy_ref (1): the seed measured the FMOPA path 5-9x faster from d_model 64, and
    # supports() keeps `auto` from picking it below that.
    Sme2Backend("sme2_f32", "_emg_sme2",
                "SME2 FMOPA (fp32, four za32 tiles): packed-row GEMMs in streaming mode, glue and Adam in C",
                f16f16=False, score=60),
    # `auto` considers the fp16 backends only when fp16 is asked for (precision: fp16), never for the
    # default fp32. On M5 the seed measured sme2_f16 ~50% slower than fp32 FMOPA at d64; M4 lacks F16F16.
    Sme2Backend("sme2_f16", "_emg_sme2_f16",
                "SME2 FMOPA with fp16 accumulation (two za16 tiles); fp32 master weights, gradient sums and Adam",
                f16f16=True, score=10, precision="fp16"),
    # Above sme2_f16: where both run (M5) it is the more accurate (fp32 accumulation) and executes fewer
    # instructions per step in the lane's count (sme2_f16's README); not timed on hardware. On M4 it is the
    # only fp16 backend.
    Sme2Backend("sme2_f16w", "_emg_sme2_f16w",
                "SME2 FMOPA with fp16 operands and fp32 accumulation (widening FMOPA, four za32 tiles; no "
                "FEAT_SME_F16F16 needed: Apple M4); fp32 master weights, gradient sums and Adam",
                f16f16=False, score=20, precision="fp16"),
)}


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
        max_batch=MAX_NATIVE_BATCH,
        precision=precision,
        envelope=ENVELOPE,
    )


class Sme2Plugin:
    """The eemicrogpt plugin of one SME2 backend whose library was built into package_dir: an entry point of
    group `eemicrogpt.backends` names the object (`package.plugin:name`), so that EEMICROGPT_DISABLE_PLUGINS
    can name each backend of a distribution."""

    def __init__(self, name: str, package_dir: Path) -> None:
        self.backend = BACKENDS[name]
        self.package_dir = package_dir

    @hookimpl
    def eemicrogpt_backends(self) -> Iterator[BackendSpec]:
        b = self.backend
        yield sme2_spec(b.name, b.description, self.package_dir, b.stem, b.f16f16, b.score, b.precision)
