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


@hookspec(firstresult=True, warn_on_impl=DeprecationWarning(
    "eemicrogpt_fp32_peak_gflops is no longer called: implement eemicrogpt_peak_gflops(precision, seconds)"))
def eemicrogpt_fp32_peak_gflops(seconds: float) -> float | None:
    """Superseded by eemicrogpt_peak_gflops("fp32", seconds) and never called. Still declared because the
    registry rejects a plugin implementing an undeclared hook (a misspelling), and a plugin built against an
    earlier core must keep loading; implementing it only earns a DeprecationWarning.
    """


@hookspec(firstresult=True)
def eemicrogpt_peak_gflops(precision: str, seconds: float) -> float | None:
    """Optional: this core's single-thread peak GFLOP/s in `precision` ("fp32": FMA; "bf16": the bf16 dot
    products, e.g. VDPBF16PS, counting 2 flops per multiply-add; "fp16": fp16 FMA), for `eemicrogpt bench`'s
    "% of peak", which compares each backend with the peak of what it computes in. None: cannot measure here.
    Asked only of the plugin of the highest-scoring available backend of that precision.
    """
