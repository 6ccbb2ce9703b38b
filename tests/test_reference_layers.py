"""The float64 reference (eemicrogpt_core/model/reference.py) against a second, independent implementation of
microgpt's loop (tests/microgpt_loop.py: scalar autodiff, position by position), at 1, 2 and 4 layers.

Every tensor's gradient is compared, layer by layer, and the loss. The loop implementation is itself checked
against central differences of its own loss, so that the two agreeing means both are right, not merely alike.
"""

from __future__ import annotations

import numpy as np
import pytest
from microgpt_loop import LoopShape, loss_and_grad

from eemicrogpt_core.model import reference
from eemicrogpt_core.model.shape import ModelShape

PARAM_STD = 0.5  # larger than the training init (0.08): peaky softmaxes, live ReLUs, a residual that matters
BATCH = 3

# (d_model, n_heads, n_layers, vocab, context): every depth with several vocabularies and contexts, the ABI's
# extremes included (vocab 2 and 256, context 1 and 64), d_model 8 for speed (the loop is scalar Python;
# the shape rules allow it) and 16 once, the smallest width a backend must cover.
CASES = [
    (8, 2, 1, 2, 1),
    (8, 2, 1, 27, 16),
    (16, 4, 1, 256, 8),
    (8, 2, 2, 2, 8),
    (8, 2, 2, 27, 16),
    (16, 4, 2, 64, 33),
    (8, 2, 4, 27, 8),
    (8, 2, 4, 256, 4),
    (8, 1, 4, 5, 64),
]

# Bounds, float64 on both sides. Measured over seeds 0-19 of every case: loss relative error <= 6.2e-15 and
# per-tensor max |difference| / max |loop gradient| <= 1.2e-13 (both at d8 L1 V2 C1, whose loss is the
# smallest): float64 rounding through a few layers, summed in two different orders. The bounds sit about
# 160x and 800x above that, so no BLAS's summation order reaches them, and far below what a modelling slip
# gives (test_check_catches_a_layer_swap: errors of order 1).
LOSS_REL_TOL = 1e-12
GRAD_REL_TOL = 1e-10
# Central differences of the loop's own loss with step FD_STEP: the error, dominated by truncation
# (h^2 f'''/6), measured at <= 2.7e-9 of the tensor's largest gradient over seeds 0-19 (2.7e-7 at h = 1e-4;
# 2.0e-8 at h = 1e-6, where rounding takes over); the bound is about 40x that. A wrong local derivative
# is off by O(1).
FD_STEP = 1e-5
FD_REL_TOL = 1e-7


def batch(shape: LoopShape, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Sequences of lengths context + 1 (the longest), 2 (the shortest) and one between, framed by the
    boundary token vocab - 1, padded with random tokens (which neither implementation may read)."""
    c, v = shape.context, shape.vocab
    lengths = np.array([c + 1, 2, rng.integers(2, c + 2)], dtype=np.uint16)[:BATCH]
    tokens = rng.integers(0, v, size=(BATCH, c + 1)).astype(np.uint8)
    for row, length in zip(tokens, lengths, strict=True):
        row[0] = row[length - 1] = v - 1
        row[1 : length - 1] = rng.integers(0, v - 1, size=length - 2)
    return tokens, lengths


def inputs(case: tuple[int, ...], seed: int) -> tuple[LoopShape, np.ndarray, np.ndarray, np.ndarray]:
    shape = LoopShape(*case)
    rng = np.random.default_rng(seed)
    params = rng.standard_normal(shape.n_params) * PARAM_STD
    return shape, params, *batch(shape, rng)


def reference_loss_and_grad(
    shape: LoopShape, params: np.ndarray, tokens: np.ndarray, lengths: np.ndarray
) -> tuple[float, np.ndarray]:
    model_shape = ModelShape(
        shape.d_model, shape.n_heads, n_layers=shape.n_layers, vocab=shape.vocab, context=shape.context
    )
    loss, grads, _ = reference.loss_and_grads(model_shape, params, tokens, lengths, dtype=np.float64)
    return loss, grads


def errors(shape: LoopShape, want: tuple[float, np.ndarray], got: tuple[float, np.ndarray]) -> dict[str, float]:
    """The loss's relative error and each tensor's max |difference| relative to its largest gradient.

    A tensor whose gradient is exactly zero (Wq and Wk at context 1: a softmax over one key is constant) is
    measured against the largest gradient of all.
    """
    overall = np.abs(want[1]).max()
    assert overall > 0, "the loop's gradient is zero everywhere, so the check would test nothing"
    out = {"loss": abs(got[0] - want[0]) / abs(want[0])}
    for name, part in shape.slices().items():
        scale = np.abs(want[1][part]).max() or overall
        out[name] = float(np.abs(got[1][part] - want[1][part]).max() / scale)
    return out


def assert_within(errs: dict[str, float]) -> None:
    worst = max((e, name) for name, e in errs.items() if name != "loss")
    print(f"loss relative error {errs['loss']:.1e}; worst gradient {worst[1]} {worst[0]:.1e}")
    assert errs["loss"] <= LOSS_REL_TOL, errs
    bad = {name: e for name, e in errs.items() if name != "loss" and e > GRAD_REL_TOL}
    assert not bad, f"gradients beyond {GRAD_REL_TOL:.0e}: {bad}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: "d{}h{}-L{}-V{}-C{}".format(*c))
def test_reference_matches_loop(case: tuple[int, ...]) -> None:
    shape, params, tokens, lengths = inputs(case, seed=0)
    want = loss_and_grad(shape, params, tokens, lengths)
    got = reference_loss_and_grad(shape, params, tokens, lengths)
    assert got[1].shape == want[1].shape
    assert_within(errors(shape, want, got))


def test_check_catches_a_layer_swap() -> None:
    """The comparison can fail: the reference given layers 0 and 1 swapped is far outside the bounds."""
    shape, params, tokens, lengths = inputs((8, 2, 2, 27, 16), seed=0)
    layers = shape.slices()
    swapped = params.copy()
    first, second = layers["layer0.Wq"].start, layers["layer1.Wq"].start
    size = second - first
    swapped[first:second], swapped[second : second + size] = params[second : second + size], params[first:second]
    want = loss_and_grad(shape, params, tokens, lengths)
    got = reference_loss_and_grad(shape, swapped, tokens, lengths)
    errs = errors(shape, want, got)
    print({name: f"{e:.1e}" for name, e in errs.items()})
    assert errs["loss"] > 1e4 * LOSS_REL_TOL
    assert min(e for name, e in errs.items() if name.startswith("layer")) > 1e4 * GRAD_REL_TOL


def test_loop_gradient_matches_central_differences() -> None:
    """The loop's autodiff against (f(p + h) - f(p - h)) / 2h at a few coordinates of every tensor."""
    shape, params, tokens, lengths = inputs((8, 2, 2, 5, 4), seed=0)
    _, grads = loss_and_grad(shape, params, tokens, lengths)
    rng = np.random.default_rng(1)
    worst = 0.0
    for name, part in shape.slices().items():
        scale = np.abs(grads[part]).max()
        live = np.flatnonzero(grads[part]) + part.start  # rows no position reads have zero gradient
        for i in rng.choice(live, size=min(3, live.size), replace=False):
            up, down = params.copy(), params.copy()
            up[i] += FD_STEP
            down[i] -= FD_STEP
            numeric = (loss_and_grad(shape, up, tokens, lengths)[0] - loss_and_grad(shape, down, tokens, lengths)[0])
            numeric /= 2 * FD_STEP
            err = abs(numeric - grads[i]) / scale
            worst = max(worst, err)
            assert err <= FD_REL_TOL, f"{name}[{i - part.start}]: autodiff {grads[i]} vs central difference {numeric}"
    print(f"worst central-difference error {worst:.1e}")
