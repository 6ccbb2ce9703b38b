"""What sme2_f16 and sme2_f16w share with the other ARM libraries (backends/arm_common/tests/
arm_session_checks.py): the envelope in context and depth, and AdamW (arm_adam.h, in fp32 on the fp32
parameters) against optim.adam_update on the library's own gradient."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from eemicrogpt_backend_sme2_f16.plugin import PACKAGE_DIR, sme2_f16, sme2_f16w

from eemicrogpt_core.backends.native import find_library
from eemicrogpt_core.model.shape import ModelShape

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "arm_common" / "tests"))
import arm_session_checks as checks

SHAPE = ModelShape(64, 4)
VARIANTS = {"sme2_f16": sme2_f16, "sme2_f16w": sme2_f16w}


@pytest.mark.parametrize("backend", sorted(VARIANTS))
def test_refuses_context_and_depth_beyond_the_envelope(backend: str) -> None:
    checks.check_envelope(backend, find_library(PACKAGE_DIR, VARIANTS[backend].backend.stem), 64)


@pytest.mark.parametrize("backend", sorted(VARIANTS))
@pytest.mark.parametrize("case", sorted(checks.CASES))
def test_adamw_step_matches_optim(backend: str, case: str) -> None:
    checks.check_adamw_step(backend, SHAPE, case)


@pytest.mark.parametrize("backend", sorted(VARIANTS))
def test_default_optimizer_step(backend: str) -> None:
    checks.check_default_step(backend, SHAPE)
