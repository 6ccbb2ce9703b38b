"""Registers sme2_f32 with eemicrogpt (entry point group `eemicrogpt.backends`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from eemicrogpt_core.backend import BackendSpec
from eemicrogpt_core.hookspec import hookimpl

from .spec import sme2_spec

PACKAGE_DIR = Path(__file__).resolve().parent
LIBRARY_STEM = "_emg_sme2"
# Above neon (10) and numpy_ref (1): the seed measured the FMOPA path 5-9x faster from d_model 64, and
# the spec's d_models keep `auto` from picking it below that.
SCORE = 60


@hookimpl
def eemicrogpt_backends() -> Iterator[BackendSpec]:
    yield sme2_spec(
        "sme2_f32",
        "SME2 FMOPA (fp32, four za32 tiles): packed-row GEMMs in streaming mode, glue and Adam in C",
        PACKAGE_DIR, LIBRARY_STEM, f16f16=False, score=SCORE,
    )
