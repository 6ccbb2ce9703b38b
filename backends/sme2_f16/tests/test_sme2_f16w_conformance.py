"""The conformance kit for sme2_f16w (fp16 operands, fp32 accumulation by the widening FMOPA) at d_model 64
and 128, plus the check that its accumulation really is fp32.

Measured under QEMU 11 (Apple profile, 512-bit) against numpy float64 (README, "Precision"): the kit's
inputs give a worst tensor relative RMS of 9.0e-4 at d64 and 1.3e-2 at d128 (Wq), a worst max error of
5.8e-2 (d128, Wf1). The large figures are ReLU gates that flip where an fp16-rounded operand moves a
pre-activation across 0: the operands are fp16 as in sme2_f16, so fp32 accumulation cannot remove them
(over six input seeds the worst was 3.2e-2 RMS and 1.3e-1 max error, for sme2_f16 4.5e-2 and 1.3e-1).
The bounds for every tensor, 3e-2 RMS and 1.2e-1 max, are 2x the kit's inputs' worst; Wlm and Wf2 have
no ReLU gate upstream and show plain rounding: at most 1.3e-3 over the six seeds and both widths
(fp16 operand rounding alone; sme2_f16's fp16 accumulation gives up to 3.6e-3), bound 2.5e-3, which
an fp16-accumulating kernel would fail at d128.
"""

from __future__ import annotations

from typing import ClassVar

from fp16_gemm_model import Fp16GemmModel, check_against_model

from eemicrogpt_core.testing import BackendConformance, per_tensor_errors

MODEL_SEEDS = range(4)  # the first four, not chosen: the bounds below hold over 41 seeds

UNGATED = ("Wlm", "Wf2")  # no ReLU gate upstream of their gradients: rounding only
UNGATED_RMS_BOUND = 2.5e-3


class TestSme2F16wConformance(BackendConformance):
    backend_name = "sme2_f16w"
    precision = "fp16"
    d_models = (64, 128)
    grad_rel_rms_tol: ClassVar[float | None] = 0.03
    grad_rel_max_tol: ClassVar[float | None] = 0.12
    trajectory_steps = 8
    trajectory_windows = 1

    def test_ungated_gradients_show_fp32_accumulation(self, d_model: int) -> None:
        """d_model comes from the kit's parametrisation (d_models)."""
        state, tokens, lengths = self.grad_inputs(d_model)
        _, want = self.reference_loss_and_grads(d_model)
        with self.open(d_model) as session:
            session.set_state(state)
            _, got = session.loss_and_grads(tokens, lengths)
        assert got is not None
        errors = per_tensor_errors(self.shape(d_model), got, want)
        for name in UNGATED:
            print(f"d{d_model} {name}: relative RMS error {errors[name][0]:.2e}")
        assert all(errors[name][0] <= UNGATED_RMS_BOUND for name in UNGATED), errors

    def test_gradients_match_the_fp16_operand_model_for_any_input(self, d_model: int) -> None:
        """Against Fp16GemmModel (fp16 operands, exact sums; fp16_gemm_model.py): 41 seeds at d64 and d128
        put every tensor within 1.9e-2 RMS and 3.7e-2 max (a ReLU gate the fp32 elementwise work flips
        where float64 does not), Wlm/Wf2 within 2.0e-4; bounds 2-2.5x that. The ungated bound fails an
        fp16-accumulating kernel (sme2_f16 is up to 4.1e-3 from this model there). The medians (2e-4 d64,
        3e-4 d128) are >= 30x below the kernel's distance from float64."""
        model_median, exact_median = check_against_model(
            self, d_model, Fp16GemmModel, MODEL_SEEDS, rms_tol=4e-2, max_tol=8e-2, ungated_rms_tol=5e-4
        )
        assert model_median < exact_median / 10
