"""The kernels library at the ABI level: which shapes it serves and how it refuses the rest.

Needs the library, which is built only on aarch64: on other machines these tests skip with that reason.
"""

from __future__ import annotations

import numpy as np
import pytest
from eemicrogpt_backend_neon import plugin, probe

from eemicrogpt_core import native
from eemicrogpt_core.model import MAX_SEQ, ModelShape

LIBRARY = plugin.library_path()
pytestmark = [
    pytest.mark.skipif(LIBRARY is None, reason="the neon kernels library is built only on aarch64"),
    # Running the kernels on a CPU the probe rejects could fault: this CPU is the probe tests' business.
    pytest.mark.skipif(probe.unavailable_reason() is not None, reason=f"{probe.unavailable_reason()}"),
]

OK, ARGUMENT, UNSUPPORTED = 0, 1, 2


@pytest.fixture(scope="module")
def lib():
    return native.load_library(str(LIBRARY))


def _create(lib, d_model: int, n_heads: int, max_batch: int) -> tuple[int, object]:
    ffi = native._ffi()
    out = ffi.new("emg_session **")
    status = lib.emg_create(d_model, n_heads, max_batch, out)
    return status, out[0]


def test_the_spec_serves_exactly_the_library_shapes(lib) -> None:
    (spec,) = plugin.eemicrogpt_backends()
    served = set()
    for d in (8, 16, 24, 32, 48, 64, 96, 128, 256):
        for h in (1, 2, 4, 8, 16):
            if lib.emg_supports(d, h):
                served.add((d, h))
            if d % h == 0 and d // h >= 4:  # a shape ModelShape accepts
                assert (spec.unsupported_reason(ModelShape(d, h), 16) is None) == ((d, h) in served)
    assert served == {(16, 4), (32, 4), (64, 4), (128, 4), (128, 8)}  # the kernels README.md lists


@pytest.mark.parametrize(
    ("d_model", "n_heads", "max_batch", "status"),
    [(16, 4, 1, OK), (128, 8, 256, OK), (32, 8, 16, UNSUPPORTED), (48, 4, 16, UNSUPPORTED),
     (16, 4, 257, UNSUPPORTED), (16, 4, 0, ARGUMENT), (16, 4, -3, ARGUMENT)],
)
def test_create_status(lib, d_model: int, n_heads: int, max_batch: int, status: int) -> None:
    got, session = _create(lib, d_model, n_heads, max_batch)
    try:
        assert got == status
        assert (session != native._ffi().NULL) == (status == OK)
    finally:
        if session != native._ffi().NULL:
            lib.emg_destroy(session)


def test_train_steps_refuses_bad_counts_and_leaves_state(lib) -> None:
    ffi = native._ffi()
    status, session = _create(lib, 16, 4, 2)
    assert status == OK
    try:
        tokens = np.full((1, 2, MAX_SEQ), 26, np.uint8)
        lengths = np.array([[3, 16]], np.uint8)
        lrs = np.full(1, 0.01, np.float32)
        losses = np.zeros(1, np.float32)

        def ptr(ctype: str, array: np.ndarray):
            return ffi.cast(ctype, ffi.from_buffer(array))

        def call(n: int, batch: int, lens: np.ndarray) -> int:
            return lib.emg_train_steps(session, n, batch, ptr("uint8_t *", tokens), ptr("uint8_t *", lens),
                                       ptr("float *", lrs), ptr("float *", losses))

        assert call(0, 2, lengths) == ARGUMENT
        assert call(1, 3, lengths) == ARGUMENT  # above the session's max_batch
        assert call(1, 2, np.array([[1, 16]], np.uint8)) == ARGUMENT
        assert call(1, 2, np.array([[3, 17]], np.uint8)) == ARGUMENT
        tokens[0, 0, 10] = 255  # padding (the first sequence has length 3): the ABI still requires < VOCAB
        assert call(1, 2, lengths) == ARGUMENT
        tokens[0, 0, 10] = 26
        step = ffi.new("int64_t *")
        n = 2 * 27 * 16 + 16 * 16 + 12 * 16 * 16
        buffers = [np.empty(n, np.float32) for _ in range(3)]
        assert lib.emg_get_state(session, *(ptr("float *", b) for b in buffers), step) == OK
        assert step[0] == 0
        assert call(1, 2, lengths) == OK and np.isfinite(losses[0]) and losses[0] > 0
    finally:
        lib.emg_destroy(session)
