"""Registers sme2_f16w with eemicrogpt (entry point group `eemicrogpt.backends`, its own entry point so that
EEMICROGPT_DISABLE_PLUGINS can name either backend of this distribution).

fp16 GEMM operands accumulated in fp32 by the widening FMOPA of base FEAT_SME: the fp16 path for SME2 CPUs
without FEAT_SME_F16F16 (Apple M4). The probe and spec come from eemicrogpt-backend-sme2, as for sme2_f16.
"""

from __future__ import annotations

from collections.abc import Iterator

from eemicrogpt_backend_sme2.spec import sme2_spec

from eemicrogpt_core.backend import BackendSpec
from eemicrogpt_core.hookspec import hookimpl

from .plugin import PACKAGE_DIR

LIBRARY_STEM = "_emg_sme2_f16w"
# `auto` considers it only when fp16 is asked for (precision: fp16). Above sme2_f16 (10): where both run
# (M5) it is the more accurate (fp32 accumulation) and executes fewer instructions per step in the lane's
# count (README); not timed on hardware. On M4 it is the only fp16 backend.
SCORE = 20


@hookimpl
def eemicrogpt_backends() -> Iterator[BackendSpec]:
    yield sme2_spec(
        "sme2_f16w",
        "SME2 FMOPA with fp16 operands and fp32 accumulation (widening FMOPA, four za32 tiles; no "
        "FEAT_SME_F16F16 needed: Apple M4); fp32 master weights, gradient sums and Adam",
        PACKAGE_DIR, LIBRARY_STEM, f16f16=False, score=SCORE, precision="fp16",
    )
