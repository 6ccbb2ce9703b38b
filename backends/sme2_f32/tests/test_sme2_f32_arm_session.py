"""What sme2_f32 shares with the other ARM libraries (backends/arm_common/tests/arm_session_checks.py): AdamW
(arm_adam.h) against optim.adam_update on the library's own gradient. Its context and depth are the ABI's
(test_sme2_f32_abi.py), so the narrower envelope's check does not apply."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from eemicrogpt_core.model.shape import ModelShape

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "arm_common" / "tests"))
import arm_session_checks as checks

SHAPE = ModelShape(64, 4)


@pytest.mark.parametrize("case", sorted(checks.CASES))
def test_adamw_step_matches_optim(case: str) -> None:
    checks.check_adamw_step("sme2_f32", SHAPE, case)


def test_default_optimizer_step() -> None:
    checks.check_default_step("sme2_f32", SHAPE)
