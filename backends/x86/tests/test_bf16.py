"""avx512_bf16 and amx_bf16 (bf16 GEMM operands, fp32 accumulation, fp32 master weights and Adam; VDPBF16PS
register tiles or AMX tiles): each against a float64 model that rounds the same GEMM operands to bf16, the
conformance kit at bf16's bounds against exact float64, 500 training steps tracking fp32 avx512, and the
threaded path.

Measured on AMD EPYC Zen 4, batch 16, params x1.5, names (the kit's recipe), 40 input seeds per size:
- against the bf16-rounding model (test below): worst per-tensor relative RMS error 2.0e-4 / 4.3e-4 / 1.7e-3
  / 3.3e-3 (d16 / d32 / d64 / d128; median 1e-7 to 6e-4), worst max error 2.1e-2 (d128). What is left is
  fp32 against float64 accumulation and the odd ReLU gate or attention weight that rounds the other way.
- against exact float64 (the format's own error, identical for kernel and model to those figures): worst
  relative RMS 1.35e-1 (d16, Wf1, seed 33) / 4.9e-2 / 9.2e-2 / 6.1e-2, medians 2.4e-2 / 2.5e-2 / 3.3e-2 /
  4.3e-2; worst max error 4.8e-1 (d64, Wf1: ReLU gates that flip when a bf16-rounded pre-activation crosses
  0 move whole terms of that gradient).
So the bf16 bound that holds for every input is not a tolerance against float64 but agreement with the
rounding model (1e-2 RMS, 5e-2 max: 3x and 2.4x headroom). The kit's inputs (seed 0) see 3.3e-2 RMS and
7.2e-2 max against float64 at the seed's shape; its shape matrix, measured on Zen 4 hardware, up to 6.6e-2
RMS and 2.4e-1 max (d80, 4 layers, layers.1.Wf1: deeper ReLU gates flip more often). The kit's bounds below
(1e-1, 3.5e-1) leave 1.5x over those; other seeds can exceed them, as above, which is why the tight checks
are the rounding-model tests in this file.
Loss relative error <= 9.7e-5; one Adam step within 8.5e-2 x lr (m 2.0e-2, v 2.2e-2 of their maxima); the
200-step trajectory against numpy float32 within 1.6e-2 (first 10 steps 2.9e-3): the kit's fp16 defaults
hold with >= 2x.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest
from eemicrogpt_backend_x86.libs import library_path
from eemicrogpt_backend_x86.probe import probe
from reference64 import rel_rms

from eemicrogpt_core.backends.backend import TrainState
from eemicrogpt_core.backends.native import NativeSession
from eemicrogpt_core.kit.conformance import (
    BackendConformance,
    edge_batch,
    load_names,
    make_batches,
    per_tensor_errors,
    synthetic_batches,
)
from eemicrogpt_core.model.optim import lr_schedule
from eemicrogpt_core.model.reference import StepModel, loss_and_grads, prepare_batch
from eemicrogpt_core.model.shape import NAMES_VOCAB, ModelShape, init_params
from eemicrogpt_core.training.config import preset


class TestAvx512Bf16Conformance(BackendConformance):
    backend_name = "avx512_bf16"
    precision = "fp16"  # the kit's reduced-precision defaults; gradients get bf16's own bounds
    d_models = (16, 32, 64, 128)
    grad_rel_rms_tol: ClassVar[float | None] = 1e-1
    grad_rel_max_tol: ClassVar[float | None] = 3.5e-1


class TestAmxBf16Conformance(TestAvx512Bf16Conformance):
    """The same operands rounded the same way, summed by the tile unit: the same bounds hold."""

    backend_name = "amx_bf16"


BF16_LIBRARIES = ("avx512_bf16", "amx_bf16")


@pytest.fixture(params=BF16_LIBRARIES)
def bf16_and_fp32(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """Paths of a bf16 library and the fp32 AVX-512 one; skipped with the probe's reason where the CPU lacks
    them."""
    monkeypatch.delenv("EEMICROGPT_X86_DISABLE", raising=False)
    for name in (request.param, "avx512"):
        result = probe(name)
        if not result.available:
            pytest.skip(result.reason)
    return str(library_path(request.param)), str(library_path("avx512"))


def to_bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bf16 (to nearest, ties to even, as VCVTNE2PS2BF16 rounds), returned as float64."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


class Bf16GemmModel(StepModel):
    """The float64 reference with every GEMM operand rounded to bf16, as the avx512_bf16 kernels round them."""

    def weight_matmul(self, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        return np.matmul(to_bf16(a), to_bf16(b), out=out)


@pytest.mark.parametrize(("d_model", "n_heads"), [(16, 4), (32, 4), (64, 4), (128, 8)])
def test_gradients_match_a_bf16_rounding_model_for_any_input(bf16_and_fp32: tuple[str, str], d_model: int,
                                                             n_heads: int) -> None:
    """Six input seeds (the kit's recipe): the kernel's error against float64 is bf16's, whatever its size
    (up to 1.35e-1 relative RMS on some seeds), while its distance from the rounding model stays tiny."""
    shape, names = ModelShape(d_model, n_heads), load_names().names
    worst_vs_model, worst_vs_exact = 0.0, 0.0
    for seed in range(6):
        params = init_params(shape, seed) * np.float32(1.5)
        tokens, lengths = edge_batch(names, 16, seed)
        model = Bf16GemmModel(shape, params.astype(np.float64))
        model.loss_and_grads(prepare_batch(tokens, lengths))
        session = NativeSession(bf16_and_fp32[0], shape, 16)
        session.set_state(TrainState.fresh(params))
        _, got = session.loss_and_grads(tokens, lengths)
        session.close()
        for name, (rms, worst) in per_tensor_errors(shape, got, model.grads).items():
            assert rms <= 1e-2 and worst <= 5e-2, f"seed {seed} {name}: rms {rms:.2e}, max {worst:.2e} off the model"
            worst_vs_model = max(worst_vs_model, rms)
        _, exact, _ = loss_and_grads(shape, params, tokens, lengths)
        worst_vs_exact = max(worst_vs_exact, *(e[0] for e in per_tensor_errors(shape, got, exact).values()))
    # The model is the kernel's arithmetic, not a loose bound: it sits ~10x closer than float64 does.
    assert worst_vs_model < worst_vs_exact / 10


@pytest.mark.parametrize("shape", [ModelShape(48, 3, 2, 64, 33), ModelShape(64, 8, 2, 100, 40),
                                   ModelShape(80, 8, 3, 256, 64)], ids=lambda s: s.describe().replace(" ", ""))
def test_layered_shapes_match_the_bf16_rounding_model(bf16_and_fp32: tuple[str, str], shape: ModelShape) -> None:
    """The per-layer packed copies, the padded LM head and long attention under bf16 GEMMs. Beyond one layer
    the kernel and the model round slightly different fp32 activations to bf16, so a few operands of the
    deeper layers round the other way: measured with a build emulating the three bf16 instructions
    (csrc/bf16_emulate.h, on a CPU without AVX512-BF16), worst per-tensor RMS / max off the model 2.4e-3 /
    2.9e-3, 1.8e-3 / 3.2e-3 and 1.2e-2 / 2.7e-2 for these shapes, against 4.1e-2 to 5.9e-2 RMS off exact float64."""
    tokens, lengths = synthetic_batches(shape, 1, 8, 5)
    params = init_params(shape, 5) * np.float32(1.5)
    model = Bf16GemmModel(shape, params.astype(np.float64))
    model.loss_and_grads(prepare_batch(tokens[0], lengths[0]))
    session = NativeSession(bf16_and_fp32[0], shape, 8)
    session.set_state(TrainState.fresh(params))
    _, got = session.loss_and_grads(tokens[0], lengths[0])
    session.close()
    worst_vs_model = 0.0
    for name, (rms, worst) in per_tensor_errors(shape, got, model.grads).items():
        assert rms <= 3e-2 and worst <= 6e-2, f"{name}: rms {rms:.2e}, max {worst:.2e} off the model"
        worst_vs_model = max(worst_vs_model, rms)
    _, exact, _ = loss_and_grads(shape, params, tokens[0], lengths[0])
    worst_vs_exact = max(e[0] for e in per_tensor_errors(shape, got, exact).values())
    assert worst_vs_model < worst_vs_exact / 3  # measured 4.9x to 23x closer


@pytest.mark.parametrize("d_model", [16, 64, 128])
def test_500_steps_track_fp32(bf16_and_fp32: tuple[str, str], d_model: int) -> None:
    """Same init, batches and LR schedule (the size's preset LR) as avx512. Measured: the 50-step mean losses
    stay within 9e-4 / 3e-4 / 3.3e-3 (d16 / d64 / d128) of fp32; single steps within 1.3e-2 / 7e-3 / 3.4e-2
    (d128's largest single-step gap is the size of fp32's own drift after a ReLU flip, see the kit)."""
    cfg, steps = preset(d_model), 500
    shape = cfg.model_shape(NAMES_VOCAB)
    tokens, lengths = make_batches(load_names().names, steps, 16, 7)
    lrs = lr_schedule(1, steps, steps, cfg.lr)
    losses = []
    for path in bf16_and_fp32:
        session = NativeSession(path, shape, 16)
        session.set_state(TrainState.fresh(init_params(shape, 3)))
        losses.append(session.train_steps(tokens, lengths, lrs))
        session.close()
    bf16, fp32 = losses
    window_means = np.abs(bf16.reshape(10, 50).mean(axis=1) - fp32.reshape(10, 50).mean(axis=1))
    assert window_means.max() < 0.03
    assert np.abs(bf16 - fp32).max() < 0.1
    assert bf16[-50:].mean() < bf16[:50].mean() - 0.25  # it learns (d16: 2.56 -> 2.23)


@pytest.mark.parametrize("threads", [2, 3])
def test_threaded_bf16_matches_one_thread(bf16_and_fp32: tuple[str, str], threads: int) -> None:
    """Threads change only the fp32 summation order: the bf16 rounding of every operand is the same."""
    shape = ModelShape(64, 8)
    tokens, lengths = make_batches(load_names().names, 1, 40, 3)
    grads = []
    for n in (1, threads):
        session = NativeSession(bf16_and_fp32[0], shape, 40)
        session.set_state(TrainState.fresh(init_params(shape, 1)))
        session.set_threads(n)
        grads.append(session.loss_and_grads(tokens[0], lengths[0])[1])
        session.close()
    assert rel_rms(grads[1], grads[0]) < 1e-5


@pytest.mark.parametrize(("shape", "batch"), [(ModelShape(64, 8), 40), (ModelShape(384, 6, 2, 65, 64), 16)])
def test_thread_counts_train_the_same_bits(bf16_and_fp32: tuple[str, str], shape: ModelShape, batch: int) -> None:
    """Five steps on 1, 2 and 3 threads end in the same state to the bit (the chunks depend on the batch alone).
    d384 runs the run-time-width step: at batch 16 two threads share each pass, split by columns."""
    tokens, lengths = synthetic_batches(shape, 5, batch, 2)
    lrs = np.full(5, 1e-2, np.float32)
    runs = []
    for threads in (1, 2, 3):
        session = NativeSession(bf16_and_fp32[0], shape, batch)
        session.set_state(TrainState.fresh(init_params(shape, 4)))
        session.set_threads(threads)
        runs.append((session.train_steps(tokens, lengths, lrs), session.get_state()))
        session.close()
    for losses, state in runs[1:]:
        np.testing.assert_array_equal(losses, runs[0][0])
        np.testing.assert_array_equal(state.params, runs[0][1].params)
