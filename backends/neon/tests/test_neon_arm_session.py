"""What neon shares with the SME2 libraries (backends/arm_common/tests/arm_session_checks.py): the envelope in
context and depth (the ABI's), and AdamW (arm_adam.h) against optim.adam_update on the library's own gradient."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from eemicrogpt_backend_neon import plugin

from eemicrogpt_core.base.abi import MAX_D_MODEL
from eemicrogpt_core.model.shape import ModelShape

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "arm_common" / "tests"))
import arm_session_checks as checks

SHAPE = ModelShape(16, 4)


def test_refuses_context_and_depth_beyond_the_envelope() -> None:
    """Neon's envelope in context and depth is the ABI's, at a compiled width and a run-time one."""
    for d_model in (16, 256, 272, MAX_D_MODEL):
        checks.check_envelope("neon", plugin.library_path(), d_model)


@pytest.mark.parametrize("case", sorted(checks.CASES))
def test_adamw_step_matches_optim(case: str) -> None:
    checks.check_adamw_step("neon", SHAPE, case)


def test_default_optimizer_step() -> None:
    checks.check_default_step("neon", SHAPE)
