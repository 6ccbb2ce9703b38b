"""What sme2_f16 and sme2_f16w share with the other ARM libraries (backends/arm_common/tests/
arm_session_checks.py): AdamW (arm_adam.h, in fp32 on the fp32 parameters) against optim.adam_update on the
library's own gradient. Their context and depth are the ABI's (test_sme2_f16_abi.py), so the narrower envelope's
check does not apply."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from eemicrogpt_core.model.shape import ModelShape

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "arm_common" / "tests"))
import arm_session_checks as checks

SHAPE = ModelShape(64, 4)
VARIANTS = ("sme2_f16", "sme2_f16w")


@pytest.mark.parametrize("backend", VARIANTS)
@pytest.mark.parametrize("case", sorted(checks.CASES))
def test_adamw_step_matches_optim(backend: str, case: str) -> None:
    checks.check_adamw_step(backend, SHAPE, case)


@pytest.mark.parametrize("backend", VARIANTS)
def test_default_optimizer_step(backend: str) -> None:
    checks.check_default_step(backend, SHAPE)
