"""The conformance kit against example_c: a second, independent C implementation of the ABI."""

from __future__ import annotations

from eemicrogpt_core.kit.conformance import DEFAULT_SHAPE_MATRIX, BackendConformance


class TestExampleCConformance(BackendConformance):
    backend_name = "example_c"
    d_models = (16,)
    grad_rel_rms_tol = 1e-5
    # The kit's matrix plus a corner only a backend that runs every shape reaches: 8 layers at context 1,
    # a width no SIMD backend has (24) and the smallest head size (4).
    shape_matrix = (*DEFAULT_SHAPE_MATRIX, (24, 6, 8, 3, 1))
