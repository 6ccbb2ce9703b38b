"""Checks every ARM library shares, run by the neon and SME2 suites (backends/<dir>/tests/test_*_arm_session.py).

- The kernels' envelope in context and depth: every ARM library runs the ABI's bounds (context 1-256, 1-12
  layers); shapes beyond them are refused, not run.
- One AdamW step (arm_adam.h, with the layer's clipping) against eemicrogpt_core.model.optim.adam_update on the
  very gradient the library computes, for weight decay, other betas and eps, and a clip that engages.

The step's bounds, derived (u = 2^-24, float32's unit roundoff). The session holds its settings in float32,
so the reference gets the same float32 values: then 1 - beta, the decay factor 1 - lr * wd (rounded once from
double on both sides) and the bias corrections (pow in double, rounded once) are the same numbers on both
sides. What remains:
- the moments: C fuses a1 * g into the moment's add (FMA), numpy rounds the product first; either result is
  within one rounding of the exact sum, so |dm| <= 2u (|m| + |a1 g|), |dv| <= 2u (v + a2 g^2) <= 4u v;
- the clip factor: the library sums g^2 in index order, numpy's dot pairwise, both in float64 (relative
  difference ~1e-16); rounded to float32 the factors agree or differ by one unit, |dg| <= 2u |g|, which adds
  2u |a1 g| to m and 4u a2 g^2 <= 4u v to v;
- the update lr m_hat / (sqrt(v_hat) + eps): dm through a divide, dv halved by the sqrt, and the four
  roundings of each side: |d upd| <= lr |dm| / bc1 / den + |upd| (|dv| / (2 v) + 8u);
- the parameter p * keep - upd: |dp| <= |d upd| + 2u (|p| + |upd|) (the last rounding may land either side).
Each bound is doubled for slack (it bounds rounding only: ignoring a setting moves the state by more than 10
times the bound, which each check also asserts). Measured under QEMU (Apple's profile): no element differed by
more than one unit in the last place, and the largest |difference| / bound was 0.46 (neon 0.38).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from eemicrogpt_core.backends.backend import TrainState
from eemicrogpt_core.backends.native import _ffi, load_library
from eemicrogpt_core.backends.registry import open_session
from eemicrogpt_core.base.abi import MAX_CONTEXT, MAX_LAYERS
from eemicrogpt_core.kit.abi_contract import UNSUPPORTED, raw_shape
from eemicrogpt_core.kit.conformance import _entry, _unusable, synthetic_batches
from eemicrogpt_core.model.optim import OptimizerSettings, adam_update, clip_scale
from eemicrogpt_core.model.shape import ModelShape, init_params

U = 2.0**-24
SLACK = 2.0
LR = 1e-2
STEP = 5  # the state's step count: the update checked is number 6, with bias corrections far from 1
BATCH = 8
SEED = 77
CLIP_FRACTION = 0.25  # the clip is this fraction of the gradient's norm: it engages
# The settings a case sets (clip: CLIP_FRACTION of the norm, filled in once the gradient is known).
CASES: dict[str, OptimizerSettings] = {
    "decay": OptimizerSettings(weight_decay=0.1),
    "betas_eps": OptimizerSettings(beta1=0.9, beta2=0.95, eps=1e-4),  # nanoGPT's betas; eps a visible share
    "low_betas": OptimizerSettings(beta1=0.3, beta2=0.45, eps=1e-5),  # 1 - beta rounded (beta below 0.5)
    "clip": OptimizerSettings(grad_clip=1.0),
    "all": OptimizerSettings(beta1=0.8, beta2=0.999, eps=1e-4, weight_decay=0.05, grad_clip=1.0),
}


def check_envelope(backend: str, library: Path | None, d_model: int, max_context: int = MAX_CONTEXT,
                   max_layers: int = MAX_LAYERS) -> None:
    """Context 1-max_context and 1-max_layers run (the ABI's bounds unless a library's kernels stop short of
    them); one more of either, the ABI's own maxima when beyond, and one past the ABI's bounds are refused."""
    _entry(backend, ())  # skips, or fails when EEMICROGPT_REQUIRE_BACKENDS names it
    if library is None:
        _unusable(backend, "its native library was not built")
    lib = load_library(str(library))
    out = _ffi().new("emg_session **")
    assert lib.emg_supports(raw_shape(d_model, 4, max_layers, 27, max_context)) == 1
    beyond = {(1, max_context + 1), (max_layers + 1, 16), (1, MAX_CONTEXT + 1), (MAX_LAYERS + 1, 16)}
    beyond |= {(1, MAX_CONTEXT)} if max_context < MAX_CONTEXT else set()
    beyond |= {(MAX_LAYERS, 16)} if max_layers < MAX_LAYERS else set()
    for layers, context in sorted(beyond):
        shape = raw_shape(d_model, 4, layers, 27, context)
        assert lib.emg_supports(shape) == 0, (layers, context)
        assert lib.emg_create(shape, 1, out) == UNSUPPORTED, (layers, context)


def as_float32(opt: OptimizerSettings) -> OptimizerSettings:
    """The settings as the session holds them (emg_optimizer's float fields)."""
    return OptimizerSettings(**{f.name: float(np.float32(getattr(opt, f.name))) for f in dataclasses.fields(opt)})


def start_state(shape: ModelShape) -> TrainState:
    """Parameters and plausible moments (v >= m^2, so every element's update is well conditioned)."""
    rng = np.random.default_rng(SEED)
    params = init_params(shape, SEED) * np.float32(1.5)
    m = (rng.standard_normal(params.size) * 1e-2).astype(np.float32)
    v = (m.astype(np.float64) ** 2 + rng.uniform(1e-4, 2e-4, params.size)).astype(np.float32)
    return TrainState(params, m, v, STEP)


class Step:
    """One library session at a fixed state and batch: its gradient, and the state one step leaves."""

    def __init__(self, backend: str, shape: ModelShape) -> None:
        entry = _entry(backend, ())  # skips, or fails when EEMICROGPT_REQUIRE_BACKENDS names it
        self.session = open_session(entry, shape, BATCH)
        self.state = start_state(shape)
        tokens, lengths = synthetic_batches(shape, 1, BATCH, SEED)
        self.tokens, self.lengths = tokens, lengths
        self.session.set_state(self.state)
        _, grads = self.session.loss_and_grads(tokens[0], lengths[0])
        assert grads is not None
        self.grads = grads

    def close(self) -> None:
        self.session.close()

    def run(self, opt: OptimizerSettings | None) -> TrainState:
        """From the start state, one step with these settings (None: never set)."""
        self.session.set_state(self.state)
        if opt is not None:
            self.session.set_optimizer(opt)
        self.session.train_steps(self.tokens, self.lengths, np.array([LR], np.float32))
        return self.session.get_state()


def reference(step: Step, opt: OptimizerSettings) -> tuple[TrainState, dict[str, np.ndarray]]:
    """optim.adam_update on the library's gradient, and the elementwise bounds of the module docstring."""
    p, m, v = (a.copy() for a in (step.state.params, step.state.adam_m, step.state.adam_v))
    lr = float(np.float32(LR))
    adam_update(p, step.grads, m, v, STEP + 1, lr, opt=opt)
    g = step.grads.astype(np.float64) * clip_scale(step.grads, opt.grad_clip)
    a1 = 1.0 - opt.beta1
    bc1, bc2 = 1.0 - opt.beta1 ** (STEP + 1), 1.0 - opt.beta2 ** (STEP + 1)
    m64, v64 = m.astype(np.float64), v.astype(np.float64)
    dm = 4 * U * (np.abs(m64) + np.abs(a1 * g))
    dv = 8 * U * v64
    den = np.sqrt(v64 / bc2) + opt.eps
    upd = lr * (m64 / bc1) / den
    d_upd = lr * dm / bc1 / den + np.abs(upd) * (dv / (2 * v64) + 8 * U)
    dp = d_upd + 2 * U * (np.abs(p.astype(np.float64)) + np.abs(upd))
    return TrainState(p, m, v, STEP + 1), {"params": SLACK * dp, "adam_m": SLACK * dm, "adam_v": SLACK * dv}


def worst_ratio(got: TrainState, want: TrainState, bounds: dict[str, np.ndarray]) -> float:
    """The largest |got - want| / bound over the parameters and both moments."""
    ratios = [np.max(np.abs(getattr(got, k).astype(np.float64) - getattr(want, k)) / bounds[k]) for k in bounds]
    return float(max(ratios))


def settings_for(case: str, grads: np.ndarray) -> OptimizerSettings:
    """The case's settings in float32, its clip (when it has one) CLIP_FRACTION of this gradient's norm."""
    opt = CASES[case]
    if opt.grad_clip > 0.0:
        norm = float(np.sqrt(np.dot(grads.astype(np.float64), grads.astype(np.float64))))
        opt = dataclasses.replace(opt, grad_clip=CLIP_FRACTION * norm)
    return as_float32(opt)


def check_adamw_step(backend: str, shape: ModelShape, case: str) -> float:
    """The library's step with the case's settings is within the bounds of optim.adam_update's, and ignoring
    any of the settings would not be. Returns the worst |difference| / bound."""
    step = Step(backend, shape)
    try:
        opt = settings_for(case, step.grads)
        got = step.run(opt)
    finally:
        step.close()
    want, bounds = reference(step, opt)
    assert got.step == want.step == STEP + 1
    ratio = worst_ratio(got, want, bounds)
    print(f"{backend} {case}: worst |difference| / bound {ratio:.3f}")
    assert ratio <= 1.0, ratio
    if opt.grad_clip > 0.0:
        assert clip_scale(step.grads, opt.grad_clip) < 0.5  # the clip engaged
    # The check can fail: each setting, dropped, moves the state beyond these bounds.
    for name, default in dataclasses.asdict(as_float32(OptimizerSettings())).items():
        if getattr(opt, name) != default:
            without, _ = reference(step, dataclasses.replace(opt, **{name: default}))
            assert worst_ratio(got, without, bounds) > 10.0, name
    return ratio


def check_default_step(backend: str, shape: ModelShape) -> None:
    """A session never given settings and one given the defaults step to the same bits (both take the path
    without decay or clipping), within the bounds of optim.adam_update's default step; settings set and
    then set back to the defaults leave no trace."""
    step = Step(backend, shape)
    try:
        never = step.run(None)
        defaults = step.run(OptimizerSettings())
        step.run(as_float32(CASES["all"]))
        back = step.run(OptimizerSettings())
    finally:
        step.close()
    for got in (defaults, back):
        for key in ("params", "adam_m", "adam_v"):
            assert np.array_equal(getattr(got, key).view(np.uint32), getattr(never, key).view(np.uint32)), key
    want, bounds = reference(step, as_float32(OptimizerSettings()))
    assert worst_ratio(never, want, bounds) <= 1.0
