"""The eemicrogpt plugin: declares `avx512`, `avx2`, `avx512_bf16` and `amx_bf16`, and measures the FP32 FMA and bf16
dot-product peaks for benchmarks."""

from __future__ import annotations

from collections.abc import Iterator

from eemicrogpt_core.backends.backend import BackendSession, BackendSpec, ProbeResult
from eemicrogpt_core.backends.hookspec import hookimpl
from eemicrogpt_core.backends.native import library_supports, native_session_factory
from eemicrogpt_core.base.abi import MAX_NATIVE_BATCH
from eemicrogpt_core.model.shape import ModelShape

from .libs import extras, library_path
from .probe import VARIANTS, probe

# In words for `eemicrogpt backends`; the authority is the library's emg_supports (csrc/session.c).
_WIDTH_PATHS = {"amx_bf16": "every width through one run-time-width step"}


def envelope(name: str) -> str:
    widths = _WIDTH_PATHS.get(name, "compiled per width to 256")
    return (f"d_model 16-1024 in steps of 16 ({widths}), any heads with head_dim >= 4, 1-12 layers, vocab 2-256, "
            "context 1-256")

_DESCRIPTIONS = {
    "avx512": "native C, AVX-512 (16-float zmm register tiles)",
    "avx2": "native C, AVX2 + FMA (8-float ymm register tiles)",
    "avx512_bf16": "native C, AVX-512 with bf16 GEMMs (VDPBF16PS, fp32 accumulation, fp32 master weights)",
    "amx_bf16": "native C, AVX-512 with bf16 GEMMs on AMX tiles (TDPBF16PS, fp32 accumulation, fp32 master weights)",
}


def _factory(name: str):
    """Looks the library up only when a session is opened (hooks must do no work)."""

    def factory(shape: ModelShape, max_batch: int, dtype: str) -> BackendSession:
        path = library_path(name)
        if path is None:
            raise RuntimeError(f"{name}: the native library _emg_{name} was not built")
        return native_session_factory(path)(shape, max_batch, dtype)

    return factory


def _probe(name: str):
    def run() -> ProbeResult:
        return probe(name)

    return run


BLOCK_ROWS = 240  # csrc/session.h BLOCK_ROWS: each thread's activations cover one block of this many rows
BLOCK_BYTES = 160 << 20  # csrc/session.h WIDE_BLOCK_BYTES: or more rows, up to about this many bytes (d > 256)


@hookimpl
def eemicrogpt_backends() -> Iterator[BackendSpec]:
    for name in VARIANTS:
        yield BackendSpec(
            name=name,
            description=_DESCRIPTIONS[name],
            probe=_probe(name),
            factory=_factory(name),
            supports=library_supports(lambda name=name: library_path(name)),  # the kernel table in C
            dtypes=("float32",),
            max_batch=MAX_NATIVE_BATCH,
            precision=VARIANTS[name].precision,
            extra={"distribution": "eemicrogpt-backend-x86", "isa": name},
            envelope=envelope(name),
            thread_independent=True,  # a batch's chunks depend on its size alone (csrc/threads.h)
            block_rows=BLOCK_ROWS,
            block_bytes=BLOCK_BYTES,
        )


@hookimpl
def eemicrogpt_peak_gflops(precision: str, seconds: float) -> float | None:
    """Single-thread peak of `precision`: FP32 FMA from the widest variant this CPU runs; for bf16 the AMX
    tile unit's where amx_bf16 runs, else VDPBF16PS's (None where the CPU has neither)."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    if precision == "fp32":
        widest = next((name for name in VARIANTS if probe(name).available), None)  # VARIANTS: widest first
        if widest is None:
            return None
        return float(extras(widest)[1].emg_x86_peak_gflops(float(seconds)))
    if precision != "bf16":
        return None
    if probe("amx_bf16").available:
        return float(extras("amx_bf16")[1].emg_x86_amx_peak_gflops(float(seconds)))
    if not probe("avx512_bf16").available:
        return None
    return float(extras("avx512_bf16")[1].emg_x86_bf16_peak_gflops(float(seconds)))
