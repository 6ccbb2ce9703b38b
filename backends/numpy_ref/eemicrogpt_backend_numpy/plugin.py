"""Registers numpy_ref with eemicrogpt (entry point group `eemicrogpt.backends`)."""

from __future__ import annotations

from collections.abc import Iterator

from eemicrogpt_core.backends.backend import BackendSpec, ProbeResult
from eemicrogpt_core.backends.hookspec import hookimpl
from eemicrogpt_core.model.shape import ModelShape
from eemicrogpt_core.training.config import MAX_CONFIG_BATCH

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
