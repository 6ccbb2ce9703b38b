"""sme2_f32's gradient distance to neon (both fp32, different accumulation orders), reported per tensor.

Both are held to 1e-5 relative RMS of numpy float64 by their conformance suites, so their distance is
bounded by 2e-5; this test prints the measured figure. It needs both backends available (the aarch64
lane under QEMU_CPU with SME2); elsewhere it skips saying which one is missing.
"""

from __future__ import annotations

import numpy as np
import pytest

from eemicrogpt_core.backends.backend import TrainState
from eemicrogpt_core.backends.registry import load_registry, open_session
from eemicrogpt_core.kit.conformance import edge_batch, load_names, per_tensor_errors, relative_errors
from eemicrogpt_core.model.shape import ModelShape, init_params

BATCH = 16


def _grads(name: str, shape: ModelShape, state: TrainState, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    entry = load_registry().get(name)
    if entry is None or not entry.available:
        pytest.skip(f"{name} is not available here: {entry.status_reason if entry else 'not installed'}")
    session = open_session(entry, shape, BATCH)
    try:
        session.set_state(state)
        _, grads = session.loss_and_grads(tokens, lengths)
    finally:
        session.close()
    assert grads is not None
    return grads


@pytest.mark.parametrize("d_model", [64, 128])
def test_gradient_distance_to_neon(d_model: int) -> None:
    shape = ModelShape(d_model, 4)
    state = TrainState.fresh(init_params(shape, 1234) * np.float32(1.5))
    tokens, lengths = edge_batch(load_names().names, BATCH, 1234)
    sme2 = _grads("sme2_f32", shape, state, tokens, lengths)
    neon = _grads("neon", shape, state, tokens, lengths)
    rms, worst = relative_errors(sme2, neon)
    print(f"d{d_model}: sme2_f32 vs neon gradients: relative RMS {rms:.2e}, max {worst:.2e}")
    for name, (t_rms, t_max) in per_tensor_errors(shape, sme2, neon).items():
        print(f"d{d_model} {name:>8}: relative RMS {t_rms:.2e}, max {t_max:.2e}")
    assert rms <= 2e-5
