"""The conformance kit against numpy_ref: the names model at four widths, and the shape matrix (ABI version
2's envelope at the kit's batch, version 3's long and deep shapes at batch 3).

On x86 these skip with the probe's reason; the aarch64 lane runs them under QEMU with
EEMICROGPT_REQUIRE_BACKENDS=neon, where an unavailable neon fails instead.

Trajectories: the kit's windowed check against numpy_ref float64 with its fp32 bounds. Measured under QEMU
(max |loss difference| vs numpy_ref float32 over 200 steps): 7.2e-7 up to d64, 1.1e-3 at d128 where
training is chaotic and numpy_ref's own float32 and float64 runs part by as much; the windows, restarted
from the reference's states, see only rounding.

Cost: under QEMU a step costs ~40x more than on hardware; the 200-step trajectories of neon plus numpy_ref
are most of this file's time. They run at d16 and d32 (the optimiser cases' too); d64 and d128 run 40 steps.
"""

from __future__ import annotations

from typing import ClassVar

from eemicrogpt_core.kit.conformance import DEFAULT_SHAPE_MATRIX, BackendConformance

# The kit's matrix (vocabularies 2-256, contexts 8-64, 1-4 layers, widths 16-128 including 48 and 80) plus
# the corners of neon's envelope: the widest width, a non-power-of-two head_dim, the deepest model, and
# context 1 at the smallest head_dim. (d_model, n_heads, n_layers, vocab, context).
NEON_SHAPE_MATRIX = (
    *DEFAULT_SHAPE_MATRIX,
    (256, 16, 1, 27, 16),
    (240, 12, 2, 100, 12),
    (16, 4, 8, 27, 16),
    (112, 28, 1, 3, 1),
)
# ABI version 3's envelope beyond version 2's, at the kit's smallest batch that still holds its extreme
# lengths (2 and context + 1) and one random row: long contexts at a small width (blocks of one whole
# sequence) and the most layers. The run-time-width step (csrc/step_wide.c) is checked by gradients in
# test_neon_library.py (d272, d512, d1024): d512 here cost 85 s of emulated time per lane run.
NEON_V3_MATRIX = ((32, 4, 1, 27, 128), (32, 4, 1, 27, 256), (16, 4, 12, 27, 16))


class TestNeonConformance(BackendConformance):
    """d_model 16 and 32: the full kit with the 200-step trajectory, and the shape matrix."""

    backend_name = "neon"
    d_models = (16, 32)
    grad_rel_rms_tol = 1e-5
    trajectory_steps = 200
    shape_matrix = NEON_SHAPE_MATRIX


class TestNeonLargeConformance(BackendConformance):
    """d_model 64 and 128 (4 heads), with sme2_f32's emulated trajectory (40 steps, windows at 0 and 30): the
    200-step runs took 550 s of the lane's neon pass here, and the kernels are the ones TestNeonConformance
    runs 200 steps through at d16 and d32. Its shape matrix is the long and deep one, at batch 3."""

    backend_name = "neon"
    d_models = (64, 128)
    grad_rel_rms_tol = 1e-5
    trajectory_steps = 40
    trajectory_windows = 2
    shape_matrix = NEON_V3_MATRIX
    matrix_batch = 3
    skip: ClassVar[dict[str, list[str]]] = {
        "input validation is shape-independent (covered by TestNeonConformance)": ["test_rejects_bad_input"],
        # The optimiser is elementwise code over the flat parameter array (arm_adam.h; the layer clips), the
        # same at every width; the one-step optimiser checks run here.
        "the optimiser trajectories are width-independent (TestNeonConformance runs them)": [
            "test_optimizer_training_follows_reference"
        ],
    }


class TestNeonEightHeads(BackendConformance):
    """d_model 128 with 8 heads (head_dim 16).

    Adam's first update from zero moments is lr * g / (|g| + 1e-8): where a gradient is ~1e-9, two correct
    implementations move that parameter by visibly different amounts (measured: losses 1.2e-4 apart within
    10 steps on 20-step batches). The kit's fp32 window bound allows for it (docs/testing-trajectories.md).
    """

    backend_name = "neon"
    d_models = (128,)
    grad_rel_rms_tol = 1e-5
    trajectory_steps = 40  # as TestNeonLargeConformance
    trajectory_windows = 2
    shape_matrix = ()  # run by TestNeonConformance and TestNeonLargeConformance
    skip: ClassVar[dict[str, list[str]]] = TestNeonLargeConformance.skip

    def heads_for(self, d_model: int) -> int:
        return 8
