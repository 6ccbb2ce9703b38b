"""Registers numpy_ref with eemicrogpt (entry point group `eemicrogpt.backends`)."""

from __future__ import annotations

from collections.abc import Iterator

from eemicrogpt_core.backend import BackendSpec, ProbeResult
from eemicrogpt_core.config import MAX_CONFIG_BATCH
from eemicrogpt_core.hookspec import hookimpl
from eemicrogpt_core.model import ModelShape

from .session import DTYPES, NumpySession

# Low, so that any available native backend wins `auto`; numpy_ref is the fallback and the oracle.
SCORE = 1


def _probe() -> ProbeResult:
    return ProbeResult.ok(SCORE, "pure numpy: runs anywhere")


def _factory(shape: ModelShape, max_batch: int, dtype: str) -> NumpySession:
    return NumpySession(shape, max_batch, dtype)


@hookimpl
def eemicrogpt_backends() -> Iterator[BackendSpec]:
    yield BackendSpec(
        name="numpy_ref",
        description="vectorised numpy reference (the oracle other backends are tested against)",
        probe=_probe,
        factory=_factory,
        d_models=None,
        n_heads=None,
        dtypes=DTYPES,
        max_batch=MAX_CONFIG_BATCH,  # every batch a config may ask for
        envelope="any valid shape (d_model up to the config's bound)",
    )
