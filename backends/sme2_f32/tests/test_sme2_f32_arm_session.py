"""What sme2_f32 shares with the other ARM libraries (backends/arm_common/tests/arm_session_checks.py): the
envelope in context and depth, and AdamW (arm_adam.h) against optim.adam_update on the library's own gradient."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from eemicrogpt_backend_sme2.plugin import PACKAGE_DIR, sme2_f32

from eemicrogpt_core.backends.native import find_library
from eemicrogpt_core.model.shape import ModelShape

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "arm_common" / "tests"))
import arm_session_checks as checks

SHAPE = ModelShape(64, 4)


def test_refuses_context_and_depth_beyond_the_envelope() -> None:
    checks.check_envelope("sme2_f32", find_library(PACKAGE_DIR, sme2_f32.backend.stem), 64)


@pytest.mark.parametrize("case", sorted(checks.CASES))
def test_adamw_step_matches_optim(case: str) -> None:
    checks.check_adamw_step("sme2_f32", SHAPE, case)


def test_default_optimizer_step() -> None:
    checks.check_default_step("sme2_f32", SHAPE)
