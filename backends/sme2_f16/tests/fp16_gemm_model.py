"""Float64 models of the fp16 SME kernels' GEMMs (sme2_common/sme2_gemm.c, sme2_step.c).

Both builds round every GEMM operand to fp16 (round to nearest even, `(__fp16)x` in to_f16 and the Neon
transposes). sme2_f16w accumulates in fp32 (widening FMOPA): modelled as an exact float64 sum.
sme2_f16 accumulates in fp16 inside ZA (non-widening FMOPA, a fused multiply-add rounded to fp16 per
term) for EMG_F16_KCHUNK = 64 terms, then drains each chunk into the fp32 result: modelled term by term.

The backward pass of the kernels runs unscaled (d(loss)/d(logits) = softmax - onehot; 1/N is applied in
the weight-gradient readout), while StepModel scales dlogits by 1/N first. Rounding is not scale-free
(1/N is rarely a power of two, and many scaled gradients would be fp16 subnormals), so the models round
backward operands at the kernel's scale. Attention's products are fp16 GEMMs in the kernels too and are
modelled the same way (StepModel.attention_matmul). Not modelled: the fp32 elementwise work between GEMMs
(softmax, RMS norm, the polynomial exp), computed in float64 here.
"""

from __future__ import annotations

import numpy as np

from eemicrogpt_core.backends.backend import TrainState
from eemicrogpt_core.kit.conformance import BackendConformance, edge_batch, per_tensor_errors
from eemicrogpt_core.model.reference import Batch, StepModel, loss_and_grads, prepare_batch
from eemicrogpt_core.model.shape import ModelShape, init_params, layer_tensor

F16_KCHUNK = 64  # EMG_F16_KCHUNK in sme2_internal.h


def to_f16(x: np.ndarray) -> np.ndarray:
    """x rounded to fp16 (numpy rounds float64 to half directly, to nearest even), as float64."""
    return np.asarray(x).astype(np.float16).astype(np.float64)


def fp16_chunked_matmul(a: np.ndarray, b: np.ndarray, chunk: int = F16_KCHUNK) -> np.ndarray:
    """a @ b (batched like np.matmul) for fp16-valued a, b as the non-widening FMOPA computes it: each term
    fused into an fp16 accumulator (the product of two fp16 values is exact in float64, so a float64 add
    and one rounding give the fused result), chunk sums added exactly (the kernel adds them in fp32)."""
    k_len = a.shape[-1]
    total = np.zeros((*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1]))
    for k0 in range(0, k_len, chunk):
        acc = np.zeros_like(total, dtype=np.float16)
        for k in range(k0, min(k0 + chunk, k_len)):
            acc = (acc + a[..., :, k, None] * b[..., k, None, :]).astype(np.float16)
        total += acc
    return total


class Fp16GemmModel(StepModel):
    """StepModel with sme2_f16w's weight GEMMs: fp16 operands, exact (fp32 in the kernel) accumulation."""

    _grad_scale = 1.0  # N during backward: the first operand of every backward GEMM is a gradient

    def backward(self, batch: Batch, c: dict[str, np.ndarray]) -> None:
        self._grad_scale = float(batch.n_live)
        try:
            super().backward(batch, c)
        finally:
            self._grad_scale = 1.0

    def gemm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The kernel's accumulation of fp16-valued operands."""
        return a @ b

    def rounded_gemm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The kernel's product of a and b rounded to fp16, a (a gradient in backward) at the kernel's scale."""
        s = self._grad_scale
        return self.gemm(to_f16(a * s), to_f16(b)) / s

    def weight_matmul(self, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        result = self.rounded_gemm(a, b)
        if out is None:
            return result
        out[...] = result
        return out

    def attention_matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self.rounded_gemm(a, b)


class Fp16AccumulationModel(Fp16GemmModel):
    """sme2_f16: fp16 operands and fp16 accumulation inside 64-term chunks."""

    def gemm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return fp16_chunked_matmul(a, b)


def ungated(shape: ModelShape) -> tuple[str, str]:
    """Wlm and the top layer's Wf2: no ReLU gate between the loss and their gradients, so in a one-layer
    model rounding alone sets their error (no gate flips)."""
    return "Wlm", layer_tensor(shape.n_layers - 1, "Wf2")


def check_against_model(kit: BackendConformance, d_model: int, model: type[Fp16GemmModel], seeds: range,
                        rms_tol: float, max_tol: float, ungated_rms_tol: float) -> tuple[float, float]:
    """The kit's recipe (its params x param_scale, its edge batch, batch size) at each of `seeds`: every
    gradient tensor within rms_tol (relative RMS) and max_tol (max error / max |model|) of `model`, Wlm and
    Wf2 within ungated_rms_tol. Returns the medians over the seeds of the worst tensor's relative RMS
    against the model and against exact float64."""
    shape, names = kit.shape(d_model), kit.names()
    tight = ungated(shape)
    vs_model, vs_exact = [], []
    with kit.open(d_model) as session:
        for seed in seeds:
            params = init_params(shape, seed) * np.float32(kit.param_scale)
            tokens, lengths = edge_batch(names, kit.batch, seed)
            session.set_state(TrainState.fresh(params))
            _, got = session.loss_and_grads(tokens, lengths)
            assert got is not None
            want = model(shape, params.astype(np.float64))
            want.loss_and_grads(prepare_batch(tokens, lengths))
            errors = per_tensor_errors(shape, got, want.grads)
            for name, (rms, top) in errors.items():
                tol = min(rms_tol, ungated_rms_tol) if name in tight else rms_tol
                assert rms <= tol and top <= max_tol, f"d{d_model} seed {seed} {name}: rms {rms:.2e}, max {top:.2e}"
            _, exact, _ = loss_and_grads(shape, params, tokens, lengths)
            vs_model.append(max(e[0] for e in errors.values()))
            vs_exact.append(max(e[0] for e in per_tensor_errors(shape, got, exact).values()))
            print(f"d{d_model} seed {seed}: worst relative RMS {vs_model[-1]:.2e} from the model, "
                  f"{vs_exact[-1]:.2e} from float64")
    return float(np.median(vs_model)), float(np.median(vs_exact))
