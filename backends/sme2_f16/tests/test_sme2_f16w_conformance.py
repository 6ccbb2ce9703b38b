"""The conformance kit for sme2_f16w (fp16 operands, fp32 accumulation by the widening FMOPA) at d_model 64
and 128, the kernel against a float64 model of its arithmetic (fp16_gemm_model.Fp16GemmModel: every GEMM
operand, weights and attention, rounded to fp16; exact sums), and the check that its accumulation is fp32.

Measured under QEMU 11 (Apple profile `max,sve=off,sme_fa64=off,sme512=on`), the kit's recipe (params x1.5,
edge batch of 16) at seeds 0-39 and the kit's 1234, per-tensor relative RMS / max error:
- against the model (test below): median of each seed's worst tensor 1.9e-4 (d64) / 3.3e-4 (d128), worst
  1.9e-2 / 7.5e-3 RMS and 3.3e-2 / 3.7e-2 max (a ReLU gate that the fp32 elementwise work flips where
  float64 does not); Wlm and Wf2 at most 2.0e-4.
- against exact float64 (fp16 operands' own error): median 1.0e-2 / 1.4e-2, worst 3.7e-2 / 4.0e-2 RMS and
  2.4e-1 / 2.6e-1 max (Wf1): ReLU gates flipped by fp16-rounded forward operands, which fp32 accumulation
  cannot remove. Wlm and Wf2 at most 1.3e-3.
So the bound that holds for any input is agreement with the model (4e-2 RMS, 8e-2 max, Wlm/Wf2 5e-4: 2.1x,
2.2x, 2.5x over the worst of the 82 inputs). The kit's own bounds below (3e-2 RMS, 1.2e-1 max) are its
inputs' bounds (seed 1234: 9.0e-4 / 1.3e-2 RMS, 8.9e-4 / 5.8e-2 max at d64 / d128); other seeds exceed
them (seed 14 at d128: 4.0e-2 RMS; seed 27: 2.6e-1 max). The ungated check against float64 (2.5e-3; 1.9x
over the 1.3e-3 worst of the 82 inputs) stays: sme2_f16's fp16 accumulation gives up to 4.2e-3 there.
"""

from __future__ import annotations

from typing import ClassVar

from fp16_gemm_model import Fp16GemmModel, check_against_model, ungated

from eemicrogpt_core.kit.conformance import BackendConformance, per_tensor_errors

MODEL_SEEDS = range(4)  # the first four, not chosen: the bounds below hold over 41 seeds

UNGATED_RMS_BOUND = 2.5e-3


class TestSme2F16wConformance(BackendConformance):
    backend_name = "sme2_f16w"
    precision = "fp16"
    d_models = (64, 128)
    # The multi-step checks at d64 only: d128's training is sme2_f32's step code, trained at d128 by its suite
    # (these took 6 of the lane's core-minutes at d128 on an Intel Xeon host); d128 keeps the one-step checks.
    training_d_models = (64,)
    grad_rel_rms_tol: ClassVar[float | None] = 0.03
    grad_rel_max_tol: ClassVar[float | None] = 0.12
    trajectory_steps = 8
    trajectory_windows = 1
    skip: ClassVar[dict[str, list[str]]] = {
        # The step's optimiser is sme2_f32's (sme2_common/sme2_step.c, arm_adam.h), whose suite runs these
        # trajectories; here the one-step optimiser checks run.
        "its only trajectory window starts at step 0, where parameters are not judged": [
            "test_optimizer_training_follows_reference"
        ],
    }
    # One shape beyond the per-d_model checks: two layers, head size 5 (odd: the widening FMOPA pairs the
    # last k row with zeros), vocabulary 64, context 33. The step's shape handling is sme2_f32's code,
    # which runs the whole matrix; emulated fp16 FMOPA is slow.
    shape_matrix = ((80, 16, 2, 64, 33),)

    def test_ungated_gradients_show_fp32_accumulation(self, d_model: int) -> None:
        """d_model comes from the kit's parametrisation (d_models)."""
        state, tokens, lengths = self.grad_inputs(d_model)
        _, want = self.reference_loss_and_grads(d_model)
        with self.open(d_model) as session:
            session.set_state(state)
            _, got = session.loss_and_grads(tokens, lengths)
        assert got is not None
        errors = per_tensor_errors(self.shape(d_model), got, want)
        tight = ungated(self.shape(d_model))
        for name in tight:
            print(f"d{d_model} {name}: relative RMS error {errors[name][0]:.2e}")
        assert all(errors[name][0] <= UNGATED_RMS_BOUND for name in tight), errors

    def test_gradients_match_the_fp16_operand_model_for_any_input(self, d_model: int) -> None:
        """Bounds and measurements in the module docstring. The Wlm/Wf2 bound fails the fp32 kernel
        sme2_f32 (6.1e-4 at d64 seed 0), a model that stops rounding (6.2e-4) and an fp16-accumulating
        kernel (sme2_f16 is up to 4.1e-3 from this model there)."""
        model_median, exact_median = check_against_model(
            self, d_model, Fp16GemmModel, MODEL_SEEDS, rms_tol=4e-2, max_tol=8e-2, ungated_rms_tol=5e-4
        )
        assert model_median < exact_median / 10
