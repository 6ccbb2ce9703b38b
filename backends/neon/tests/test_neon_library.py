"""The kernels library at the ABI level: which shapes it serves and how it refuses the rest.

Needs the library, which is built only on aarch64: on other machines these tests skip with that reason.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from eemicrogpt_backend_neon import plugin, probe

from eemicrogpt_core.backends import native
from eemicrogpt_core.backends.backend import TrainState
from eemicrogpt_core.backends.registry import load_registry, open_session
from eemicrogpt_core.base.abi import LENGTH_DTYPE, MAX_VOCAB, MIN_VOCAB
from eemicrogpt_core.kit.abi_contract import raw_shape
from eemicrogpt_core.kit.conformance import DEFAULT_TOLERANCES, per_tensor_errors
from eemicrogpt_core.model.shape import ModelShape, init_params

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "arm_common" / "tests"))
import arm_session_checks as checks

LIBRARY = plugin.library_path()
pytestmark = [
    pytest.mark.skipif(LIBRARY is None, reason="the neon kernels library is built only on aarch64"),
    # Running the kernels on a CPU the probe rejects could fault: this CPU is the probe tests' business.
    pytest.mark.skipif(probe.unavailable_reason() is not None, reason=f"{probe.unavailable_reason()}"),
]

OK, ARGUMENT, UNSUPPORTED = (native.STATUS[n] for n in ("EMG_OK", "EMG_ERR_ARGUMENT", "EMG_ERR_UNSUPPORTED"))
# The kernels' envelope in context and depth, narrower than the ABI's (test_neon_arm_session.py checks that
# shapes beyond it are refused).
MAX_CONTEXT, MAX_LAYERS = checks.ARM_MAX_CONTEXT, checks.ARM_MAX_LAYERS


@pytest.fixture(scope="module")
def lib():
    return native.load_library(str(LIBRARY))


def neon_runs(d_model: int, n_heads: int) -> bool:
    """The envelope README.md states: widths 16-256 in steps of 16, head_dim a multiple of 4."""
    return 16 <= d_model <= 256 and d_model % 16 == 0 and d_model % n_heads == 0 and (d_model // n_heads) % 4 == 0


def test_the_spec_serves_exactly_the_envelope(lib) -> None:
    (spec,) = plugin.eemicrogpt_backends()
    checked = 0
    for d in range(8, 273, 8):
        for h in (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 32, 64):
            if d % h or d // h < 4:  # ModelShape refuses it; the library must too
                assert not lib.emg_supports(raw_shape(d, h)), (d, h)
                continue
            want = neon_runs(d, h)
            assert bool(lib.emg_supports(raw_shape(d, h))) == want, (d, h)
            assert (spec.unsupported_reason(ModelShape(d, h), 16) is None) == want, (d, h)
            checked += 1
    assert checked > 100


@pytest.mark.parametrize("d_model", [16, 256])
def test_every_depth_vocabulary_and_context_of_the_envelope_is_served(lib, d_model: int) -> None:
    for layers in (1, MAX_LAYERS):
        for vocab in (MIN_VOCAB, 27, MAX_VOCAB):
            for context in (1, 33, MAX_CONTEXT):
                assert lib.emg_supports(raw_shape(d_model, 4, layers, vocab, context)), (layers, vocab, context)


def _create(lib, shape, max_batch: int) -> tuple[int, object]:
    out = native._ffi().new("emg_session **")
    status = lib.emg_create(shape, max_batch, out)
    return status, out[0]


@pytest.mark.parametrize(
    ("dims", "max_batch", "status"),
    [((16, 4), 1, OK), ((256, 64, MAX_LAYERS, MAX_VOCAB, MAX_CONTEXT), 256, OK), ((48, 12, 2, 2, 1), 3, OK),
     ((80, 16), 16, UNSUPPORTED),  # head_dim 5: valid, but not a multiple of 4
     ((272, 4), 16, UNSUPPORTED), ((8, 2), 16, UNSUPPORTED), ((24, 2), 16, UNSUPPORTED),
     ((16, 4), 257, UNSUPPORTED), ((16, 4), 0, ARGUMENT), ((16, 4), -3, ARGUMENT)],
)
def test_create_status(lib, dims: tuple[int, ...], max_batch: int, status: int) -> None:
    got, session = _create(lib, raw_shape(*dims), max_batch)
    try:
        assert got == status
        assert (session != native._ffi().NULL) == (status == OK)
    finally:
        if session != native._ffi().NULL:
            lib.emg_destroy(session)


def test_packed_blocks_match_the_reference_at_their_edges() -> None:
    """Live positions are packed into blocks of 64 rows (csrc/session.h): rows that fill a block exactly, a
    block of one position, and a row of 64 positions that cannot join the block before it. Gradients are
    those of numpy_ref float64 within the conformance kit's fp32 bounds."""
    shape = ModelShape(16, 4, 2, 7, MAX_CONTEXT)
    live = [40, 24, 1, 63, 1, 64, 5]  # blocks: 40+24 | 1+63 | 1 | 64 | 5
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, shape.boundary, size=(len(live), shape.seq_len), dtype=np.uint8)
    tokens[:, 0] = shape.boundary
    lengths = np.array([t + 1 for t in live], LENGTH_DTYPE)
    state = TrainState.fresh(init_params(shape, 5) * np.float32(1.5))
    registry = load_registry()
    results = []
    for name, dtype in (("neon", "float32"), ("numpy_ref", "float64")):
        session = open_session(registry.get(name), shape, len(live), dtype)
        try:
            session.set_state(state)
            results.append(session.loss_and_grads(tokens, lengths))
        finally:
            session.close()
    (loss, grads), (want_loss, want) = results
    tol = DEFAULT_TOLERANCES["fp32"]
    assert abs(loss - want_loss) <= tol.loss_rel * want_loss
    for name, (rms, worst) in per_tensor_errors(shape, grads, want).items():
        assert rms <= tol.grad_rel_rms and worst <= tol.grad_rel_max, (name, rms, worst)
