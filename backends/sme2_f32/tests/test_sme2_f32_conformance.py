"""The conformance kit against numpy_ref at d_model 64 and 128 (the sizes sme2_f32 serves).

On x86 these skip with the probe's reason; the aarch64 lane runs them under QEMU with
EEMICROGPT_REQUIRE_BACKENDS=sme2_f32 (512- and 256-bit streaming vectors), where unavailable fails.
Emulated FMOPA is slow (about 0.14 s per d64 batch-16 step under QEMU 11), so the trajectory is shorter
than the kit's default, checked in two windows of 10 steps (one for the 10-step run); the bounds are the
kit's fp32 ones.
"""

from __future__ import annotations

from typing import ClassVar

from eemicrogpt_core.testing import BackendConformance


class TestSme2F32Conformance(BackendConformance):
    backend_name = "sme2_f32"
    d_models = (64, 128)
    grad_rel_rms_tol = 1e-5
    trajectory_steps = 40
    trajectory_windows = 2


class TestSme2F32EightHeads(BackendConformance):
    """d_model 128 with 8 heads (head_dim 16): gradients, one Adam step and a short run."""

    backend_name = "sme2_f32"
    d_models = (128,)
    grad_rel_rms_tol = 1e-5
    trajectory_steps = 10
    trajectory_windows = 1
    skip: ClassVar[dict[str, list[str]]] = {
        "input validation does not depend on the head count (covered by TestSme2F32Conformance)": [
            "test_rejects_bad_input"
        ],
    }

    def heads_for(self, d_model: int) -> int:
        return 8
