"""The conformance kit against example_c: a second, independent C implementation of the ABI."""

from __future__ import annotations

from eemicrogpt_core.testing import BackendConformance


class TestExampleCConformance(BackendConformance):
    backend_name = "example_c"
    d_models = (16,)
    grad_rel_rms_tol = 1e-5
