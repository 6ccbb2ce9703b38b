"""150 d64 training steps of sme2_f16 and of sme2_f16w against sme2_f32 on the same batches: the losses must
agree.

The bound is 0.03 on the loss; it is applied to the mean loss of the last 100 steps (single-batch losses
are noisy) and to the mean over all 150. Measured in the Apple profile, the differences (last 100 / all)
were 0.0006 / 0.0005 (sme2_f16) and 0.0007 / 0.0004 (sme2_f16w) at 150 steps (commit 2d3f67d, an Intel Xeon
host, 106 s for the two tests); 0.0008 / 0.0003 and 0.0005 / 0.0001 at 250 steps (commit 99afccd);
0.0002-0.0003 / 0.0002-0.0005 at 500 (README.md). 150 steps keep the lane's longest test short. Batch 4
keeps the emulated run affordable (QEMU emulates fp16 FMOPA in software); the time it took is printed. Needs
both backends (the aarch64 lane under QEMU_CPU=max,sme512=on) and runs once, at 512-bit streaming vectors:
at other lengths the conformance kit covers correctness.
"""

from __future__ import annotations

import functools
import time

import numpy as np
import pytest
from eemicrogpt_backend_sme2_f16 import probe

from eemicrogpt_core.backends.backend import TrainState
from eemicrogpt_core.backends.registry import load_registry, open_session
from eemicrogpt_core.kit.conformance import load_names, make_batches
from eemicrogpt_core.model.optim import lr_schedule
from eemicrogpt_core.model.shape import ModelShape, init_params

STEPS, BATCH, LR, SEED = 150, 4, 0.003, 7
BOUND = 0.03


def _run(name: str, tokens: np.ndarray, lengths: np.ndarray, lrs: np.ndarray) -> tuple[np.ndarray, float]:
    entry = load_registry().get(name)
    if entry is None or not entry.available:
        pytest.skip(f"{name} is not available here: {entry.status_reason if entry else 'not installed'}")
    shape = ModelShape(64, 4)
    session = open_session(entry, shape, BATCH)
    try:
        session.set_state(TrainState.fresh(init_params(shape, SEED)))
        start = time.perf_counter()
        losses = session.train_steps(tokens, lengths, lrs)
        return losses, time.perf_counter() - start
    finally:
        session.close()


def _inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    tokens, lengths = make_batches(load_names().names, STEPS, BATCH, SEED)
    return tokens, lengths, lr_schedule(1, STEPS, STEPS, LR)


@functools.cache
def _f32_run() -> tuple[np.ndarray, float]:
    """sme2_f32's run, once for both fp16 backends."""
    return _run("sme2_f32", *_inputs())


@pytest.mark.parametrize("name", ["sme2_f16", "sme2_f16w"])
def test_d64_training_loss_tracks_sme2_f32(name: str) -> None:
    for needed in (name, "sme2_f32"):
        entry = load_registry().get(needed)
        if entry is None or not entry.available:
            pytest.skip(f"{needed} is not available here: {entry.status_reason if entry else 'not installed'}")
    if probe.streaming_vector_bits() != 512:
        pytest.skip("run once, at 512-bit streaming vectors (the conformance kit covers other lengths)")
    f16, f16_seconds = _run(name, *_inputs())
    f32, f32_seconds = _f32_run()
    assert np.all(np.isfinite(f16)) and np.all(np.isfinite(f32))
    last = abs(float(f16[-100:].mean()) - float(f32[-100:].mean()))
    whole = abs(float(f16.mean()) - float(f32.mean()))
    print(
        f"{name}: {STEPS} steps d64 batch {BATCH}: last-100 mean loss {f16[-100:].mean():.4f} vs f32 "
        f"{f32[-100:].mean():.4f} (diff {last:.4f}); {STEPS}-step mean diff {whole:.4f}; largest per-step "
        f"diff {np.abs(f16 - f32).max():.4f}; time {name} {f16_seconds:.1f}s, f32 {f32_seconds:.1f}s"
    )
    assert last <= BOUND and whole <= BOUND
