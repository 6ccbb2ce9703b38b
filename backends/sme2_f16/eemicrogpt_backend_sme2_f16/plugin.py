"""Registers sme2_f16 with eemicrogpt (entry point group `eemicrogpt.backends`).

The probe and spec come from eemicrogpt-backend-sme2 (a dependency): same CPU family, same shapes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from eemicrogpt_backend_sme2.spec import sme2_spec

from eemicrogpt_core.backend import BackendSpec
from eemicrogpt_core.hookspec import hookimpl

PACKAGE_DIR = Path(__file__).resolve().parent
LIBRARY_STEM = "_emg_sme2_f16"
# `auto` considers it only when fp16 is asked for (precision: fp16), never for the default fp32. On M5 the
# seed measured this path ~50% slower than fp32 FMOPA at d64; M4 lacks FEAT_SME_F16F16.
SCORE = 10


@hookimpl
def eemicrogpt_backends() -> Iterator[BackendSpec]:
    yield sme2_spec(
        "sme2_f16",
        "SME2 FMOPA with fp16 accumulation (two za16 tiles); fp32 master weights, gradient sums and Adam",
        PACKAGE_DIR, LIBRARY_STEM, f16f16=True, score=SCORE, precision="fp16",
    )
