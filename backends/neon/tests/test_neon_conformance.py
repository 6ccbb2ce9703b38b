"""The conformance kit against numpy_ref, at every shape neon has a kernel for.

On x86 these skip with the probe's reason; the aarch64 lane runs them under QEMU with
EEMICROGPT_REQUIRE_BACKENDS=neon, where an unavailable neon fails instead.

Trajectories (the kit's lr per size, batch 16; measured under QEMU, max |loss difference| vs numpy_ref
float32 over the run):

    d_model/heads   200 steps   first 30   numpy_ref float32 vs float64, 200 steps
    16/4            7.2e-7      -          4.8e-7
    64/4            7.2e-7      4.8e-7     4.8e-7
    128/4           1.1e-3      7.2e-7     1.1e-3
    128/8           1.4e-3      4.8e-7     -

Up to d64 neon tracks numpy_ref to float32 rounding. At d128 training is chaotic: numpy_ref's own float32
and float64 runs part by 1.1e-3, and neon lands as far from numpy_ref float32 as those two are from each
other. The 200-step bound is therefore the kit's fp32 default 5e-3 (3.5x the worst measured) and 1e-4
for d16/32 and for the short runs, where only rounding separates the two.

Cost: under QEMU a step costs ~40x more than on hardware; 200 steps of neon plus numpy_ref take ~215 s
at d_model 128 there. The lane pays it: the issue asks for the 200-step trajectory at every size.
"""

from __future__ import annotations

from typing import ClassVar

from eemicrogpt_core.testing import BackendConformance


class TestNeonConformance(BackendConformance):
    """d_model 16 and 32: the full kit with the 200-step trajectory, everywhere."""

    backend_name = "neon"
    d_models = (16, 32)
    grad_rel_rms_tol = 1e-5
    trajectory_steps = 200
    trajectory_tol: ClassVar[float | None] = 1e-4


class TestNeonLargeConformance(BackendConformance):
    """d_model 64 and 128 (4 heads)."""

    backend_name = "neon"
    d_models = (64, 128)
    grad_rel_rms_tol = 1e-5
    trajectory_steps = 200
    trajectory_tol: ClassVar[float | None] = 5e-3
    skip: ClassVar[dict[str, list[str]]] = {
        "input validation is shape-independent (covered by TestNeonConformance)": ["test_rejects_bad_input"],
    }


class TestNeonEightHeads(BackendConformance):
    """The d_model 128 kernel with 8 heads (head_dim 16).

    Early bound: Adam's first update from zero moments is lr * g / (|g| + 1e-8). On the 20-step batches
    some Wo gradients are ~1e-9, where neon's and numpy_ref's values differ by 2e-9 (2e-8 of the tensor's
    scale, far inside the gradient bound), so that parameter moves 0.14 lr more in one than the other;
    the losses then differ by up to 1.2e-4 within 10 steps (4.8e-7 on the 200-step batches, where no
    gradient is that small). 3e-4 leaves 2.5x headroom.
    """

    backend_name = "neon"
    d_models = (128,)
    grad_rel_rms_tol = 1e-5
    trajectory_steps = 200
    trajectory_early_tol: ClassVar[float | None] = 3e-4
    trajectory_tol: ClassVar[float | None] = 5e-3
    skip: ClassVar[dict[str, list[str]]] = TestNeonLargeConformance.skip

    def heads_for(self, d_model: int) -> int:
        return 8
