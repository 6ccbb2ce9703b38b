"""The conformance kit against example_c: a second, independent C implementation of the ABI."""

from __future__ import annotations

from eemicrogpt_core.kit.conformance import DEFAULT_SHAPE_MATRIX, BackendConformance


class TestExampleCConformance(BackendConformance):
    backend_name = "example_c"
    d_models = (16,)
    grad_rel_rms_tol = 1e-5
    # The kit's matrix plus corners only a backend that runs every shape reaches: the ABI's 12 layers at context
    # 1, a width no SIMD backend has (24) and the smallest head size (4); the ABI's context, 256, whose sequences
    # of up to 257 tokens need uint16 lengths. (Both at once put 1.04M ReLU inputs in the kit's batch; one lies
    # 1.3e-8 from the kink, and float32 puts it on the other side than float64 does: a legitimately different
    # gradient row.)
    shape_matrix = (*DEFAULT_SHAPE_MATRIX, (24, 6, 12, 3, 1), (16, 4, 1, 5, 256))
