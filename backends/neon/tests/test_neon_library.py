"""The kernels library at the ABI level: which shapes it serves and how it refuses the rest.

Needs the library, which is built only on aarch64: on other machines these tests skip with that reason.
"""

from __future__ import annotations

import numpy as np
import pytest
from eemicrogpt_backend_neon import plugin, probe

from eemicrogpt_core.backends import native
from eemicrogpt_core.backends.backend import TrainState
from eemicrogpt_core.backends.registry import load_registry, open_session
from eemicrogpt_core.base.abi import LENGTH_DTYPE, MAX_CONTEXT, MAX_D_MODEL, MAX_LAYERS, MAX_VOCAB, MIN_VOCAB
from eemicrogpt_core.kit.abi_contract import raw_shape
from eemicrogpt_core.kit.conformance import DEFAULT_TOLERANCES, per_tensor_errors
from eemicrogpt_core.model.shape import ModelShape, init_params

LIBRARY = plugin.library_path()
pytestmark = [
    pytest.mark.skipif(LIBRARY is None, reason="the neon kernels library is built only on aarch64"),
    # Running the kernels on a CPU the probe rejects could fault: this CPU is the probe tests' business.
    pytest.mark.skipif(probe.unavailable_reason() is not None, reason=f"{probe.unavailable_reason()}"),
]

OK, ARGUMENT, UNSUPPORTED = (native.STATUS[n] for n in ("EMG_OK", "EMG_ERR_ARGUMENT", "EMG_ERR_UNSUPPORTED"))


@pytest.fixture(scope="module")
def lib():
    return native.load_library(str(LIBRARY))


def neon_runs(d_model: int, n_heads: int) -> bool:
    """The envelope README.md states: widths 16-1024 in steps of 16, head_dim a multiple of 4."""
    return (16 <= d_model <= MAX_D_MODEL and d_model % 16 == 0 and d_model % n_heads == 0
            and (d_model // n_heads) % 4 == 0)


def test_the_spec_serves_exactly_the_envelope(lib) -> None:
    """Every multiple of 8 up to the ABI's widest: the compiled widths, the run-time ones (272-1024) and the
    refused (test_create_status tries one width step past the widest)."""
    (spec,) = plugin.eemicrogpt_backends()
    checked = 0
    for d in range(8, MAX_D_MODEL + 1, 8):
        for h in (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 32, 64):
            if d % h or d // h < 4:  # ModelShape refuses it; the library must too
                assert not lib.emg_supports(raw_shape(d, h)), (d, h)
                continue
            want = neon_runs(d, h)
            assert bool(lib.emg_supports(raw_shape(d, h))) == want, (d, h)
            assert (spec.unsupported_reason(ModelShape(d, h), 16) is None) == want, (d, h)
            checked += 1
    assert checked > 800  # 810 (width, heads) pairs with a head size of at least 4


@pytest.mark.parametrize("d_model", [16, 256, 272, MAX_D_MODEL])
def test_every_depth_vocabulary_and_context_of_the_envelope_is_served(lib, d_model: int) -> None:
    for layers in (1, 8, MAX_LAYERS):
        for vocab in (MIN_VOCAB, 27, MAX_VOCAB):
            for context in (1, 33, 64, 65, MAX_CONTEXT):
                assert lib.emg_supports(raw_shape(d_model, 4, layers, vocab, context)), (layers, vocab, context)


def _create(lib, shape, max_batch: int) -> tuple[int, object]:
    out = native._ffi().new("emg_session **")
    status = lib.emg_create(shape, max_batch, out)
    return status, out[0]


@pytest.mark.parametrize(
    ("dims", "max_batch", "status"),
    [((16, 4), 1, OK), ((256, 64, MAX_LAYERS, MAX_VOCAB, MAX_CONTEXT), 256, OK), ((48, 12, 2, 2, 1), 3, OK),
     ((80, 16), 16, UNSUPPORTED),  # head_dim 5: valid, but not a multiple of 4
     ((272, 4), 16, OK), ((400, 16), 16, UNSUPPORTED),  # the run-time width: head_dim 68; 25
     ((MAX_D_MODEL + 16, 4), 16, UNSUPPORTED), ((8, 2), 16, UNSUPPORTED), ((24, 2), 16, UNSUPPORTED),
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


# Live positions are packed into blocks of 64 rows, or of one context's rows when the context is longer
# (csrc/session.h, neon_block_rows): per case a shape and the live positions (length - 1) of each sequence,
# chosen so that rows fill a block exactly, a block holds one position, and a sequence that cannot join the
# block before it starts the next. Beyond the blocks: the deepest model and the run-time-width step
# (csrc/step_wide.c) at its narrowest width, at a power of two and at the widest, with 4-16 heads.
# Bounds: the conformance kit's fp32 ones, but gradients at the run-time widths get 3e-5 relative RMS per
# tensor: sums of 1024-4096 float32 terms run longer there, and at d1024 tok_emb measured 1.1e-5 under QEMU
# (x86's wide step: up to 7.8e-6 overall, backends/x86/tests/test_native.py); 3e-5 is 2.7x over that.
WIDE_GRAD_REL_RMS = 3e-5
PACKED_CASES = {
    "block64": (ModelShape(16, 4, 2, 7, 64), [40, 24, 1, 63, 1, 64, 5]),  # 40+24 | 1+63 | 1 | 64 | 5
    "context100": (ModelShape(16, 4, 2, 27, 100), [100, 60, 40, 1, 99, 7]),  # 100 | 60+40 | 1+99 | 7
    "context256": (ModelShape(32, 4, 1, 27, MAX_CONTEXT), [255, 1, 100, 156, 256, 3]),  # 255+1 | 100+156 | 256 | 3
    "layers12": (ModelShape(16, 4, MAX_LAYERS, 27, 16), [16, 5, 9]),
    "d272": (ModelShape(272, 4, 2, 27, 9), [9, 3]),
    "d512": (ModelShape(512, 8, 1, 65, 16), [16, 7]),
    "d1024": (ModelShape(MAX_D_MODEL, 16, 1, 27, 8), [8, 2]),
}


@pytest.mark.parametrize("case", list(PACKED_CASES))
def test_packed_blocks_match_the_reference_at_their_edges(case: str) -> None:
    """Gradients are those of numpy_ref float64 within the conformance kit's fp32 bounds."""
    shape, live = PACKED_CASES[case]
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
    rms_bound = WIDE_GRAD_REL_RMS if shape.d_model > 256 else tol.grad_rel_rms
    assert abs(loss - want_loss) <= tol.loss_rel * want_loss
    for name, (rms, worst) in per_tensor_errors(shape, grads, want).items():
        assert rms <= rms_bound and worst <= tol.grad_rel_max, (name, rms, worst)
