"""The conformance kit against numpy_ref at d_model 64 and 128, and its shape matrix over sme2_f32's envelope.

On x86 these skip with the probe's reason; the aarch64 lane runs them under QEMU with
EEMICROGPT_REQUIRE_BACKENDS=sme2_f32 (512- and 256-bit streaming vectors), where unavailable fails.
Emulated FMOPA is slow (a d64 batch-16 step takes about 0.14 s under QEMU 11 on an AMD EPYC host and 1.7 s
on an Intel Xeon host: tools/a64lane/README.md says why), so the trajectory is shorter
than the kit's default, checked in two windows of 10 steps (one for the 10-step run); the bounds are the
kit's fp32 ones.

SHAPE_MATRIX is the kit's default matrix moved into the envelope (d_model 64-256): every vocabulary bound
(2, 256) and 27 and 64, contexts 8, 12, 16, 33 (odd) and 64, 1, 2 and 4 layers, widths 80 (not a power of
two) and 256 (the top), head sizes 4 (16 heads at d64, 64 at d256) to 20.
"""

from __future__ import annotations

from typing import ClassVar

import pytest

from eemicrogpt_core.kit.conformance import BackendConformance, _entry, matrix_id
from eemicrogpt_core.model.shape import ModelShape

SHAPE_MATRIX = (  # (d_model, n_heads, n_layers, vocab, context)
    (64, 16, 1, 2, 8),
    (80, 4, 4, 27, 16),
    (64, 4, 2, 256, 64),
    (128, 8, 1, 64, 33),
    (256, 64, 1, 27, 16),
)


class TestSme2F32Conformance(BackendConformance):
    backend_name = "sme2_f32"
    d_models = (64, 128)
    # The multi-step checks at d128 cost about 7 s per emulated step on an Intel Xeon host (32 minutes of the
    # lane's core time under QEMU 11.1, tools/a64lane/README.md); d128's kernels train in
    # TestSme2F32EightHeads, so d64 carries those checks here.
    training_d_models = (64,)
    grad_rel_rms_tol = 1e-5
    trajectory_steps = 40
    trajectory_windows = 2
    shape_matrix = SHAPE_MATRIX
    # Under emulation a step's cost is its rows' (d256h64L1V27C16: about 16 s a step at the kit's batch of 8 on
    # an Intel Xeon host); 4 sequences still hold the kit's extreme lengths (2 and context + 1) and two more.
    matrix_batch = 4
    skip: ClassVar[dict[str, list[str]]] = {
        # 6 minutes of the lane's core time on an Intel Xeon host, for code the neon suite trains: the layer's
        # clip (emg_clip_gradients) and arm_adam.h are shared. The one ARM-specific difference (sme2's g * g
        # order, ADAM_G2_SCALE_FIRST) is in every update, so test_optimizer_step_matches_reference sees it.
        "the optimiser settings are the shared ARM layer's and arm_adam.h's, trained by the neon suite": [
            "test_optimizer_training_follows_reference"
        ],
    }


class TestSme2F32EightHeads(BackendConformance):
    """d_model 128 with 8 heads (head_dim 16): gradients, one Adam step and a short run."""

    backend_name = "sme2_f32"
    d_models = (128,)
    grad_rel_rms_tol = 1e-5
    trajectory_steps = 10
    trajectory_windows = 1
    shape_matrix = ()  # TestSme2F32Conformance runs it
    skip: ClassVar[dict[str, list[str]]] = {
        "input validation does not depend on the head count (covered by TestSme2F32Conformance)": [
            "test_rejects_bad_input"
        ],
        "the optimiser does not depend on the head count (see TestSme2F32Conformance)": [
            "test_optimizer_training_follows_reference"
        ],
        # 3.4 minutes of the lane's core time at d128 on an Intel Xeon host; d128's reruns are the shape
        # matrix's (test_matrix_determinism at d128h8L1V64C33), chunking is the layer's (TestSme2F32Conformance).
        "reruns and chunked calls are checked at d128 by the shape matrix and at d64 by TestSme2F32Conformance": [
            "test_determinism",
            "test_chunked_calls_match_one_call",
        ],
    }

    def heads_for(self, d_model: int) -> int:
        return 8


# ABI version 3's envelope beyond version 2's, gradients against float64 only, at a batch of 2 (the kit's
# extreme lengths: one full sequence, one of a single prediction), as emulation is slow: context 256 (the
# causal attention GEMMs skip blocks and contraction ranges), 12 layers, and width 512 at 1 layer.
V3_SHAPES = ((64, 4, 1, 27, 256), (64, 4, 12, 27, 16), (512, 8, 1, 27, 16))


class _V3Gradients(TestSme2F32Conformance):
    """TestSme2F32Conformance's matrix gradient check at a batch of 2 (not collected: only that check runs)."""

    matrix_batch = 2


@pytest.mark.parametrize("dims", V3_SHAPES, ids=matrix_id)
def test_v3_shape_gradients_match_reference(dims: tuple[int, int, int, int, int]) -> None:
    _entry(_V3Gradients.backend_name, ())  # skips (or fails, when required) before the reference's work
    _V3Gradients().test_matrix_gradients_match_reference(ModelShape(*dims))
