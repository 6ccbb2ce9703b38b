"""The StepBackend hook specification: the one hook a backend plugin implements."""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from .backend import BackendSpec

PROJECT = "eemicrogpt"
ENTRY_POINT_GROUP = "eemicrogpt.backends"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def eemicrogpt_backends() -> Iterable[BackendSpec]:  # type: ignore[empty-body]  # a spec: only implementations run
    """Yield (or return a list of) BackendSpec descriptors.

    Do no work here: no native libraries loaded, no CPU probing. The registry calls each spec's probe
    lazily and guards it, so a raising probe only marks that backend broken.
    """


@hookspec(firstresult=True)
def eemicrogpt_fp32_peak_gflops(seconds: float) -> float | None:
    """Optional: measure this core's single-thread FP32 FMA peak in GFLOP/s (used by `eemicrogpt bench`).

    A native plugin that ships a microbenchmark for the host ISA implements it; None means "cannot here".
    The core asks only the plugin of the highest-scoring available backend (registry.peak_gflops), so no
    other plugin can replace the figure "% of peak" is computed against.
    """


@hookspec(firstresult=True)
def eemicrogpt_peak_gflops(precision: str, seconds: float) -> float | None:
    """Optional: this core's single-thread peak GFLOP/s in `precision` ("fp32": FMA; "bf16": the bf16 dot
    products, e.g. VDPBF16PS, counting 2 flops per multiply-add; "fp16": fp16 FMA), for `eemicrogpt bench`'s
    "% of peak", which compares each backend with the peak of what it computes in. None: cannot measure here.
    Asked only of the plugin of the highest-scoring available backend of that precision; a plugin without
    it is asked eemicrogpt_fp32_peak_gflops for fp32.
    """
