"""The shared conformance kit, run on both x86 variants (and on 8-head shapes for avx512)."""

from __future__ import annotations

from eemicrogpt_core.testing import BackendConformance


class TestAvx512Conformance(BackendConformance):
    backend_name = "avx512"
    d_models = (16, 32, 64, 128)


class TestAvx512EightHeads(BackendConformance):
    backend_name = "avx512"
    d_models = (32, 64, 128)
    trajectory_steps = 50

    def heads_for(self, d_model: int) -> int:
        return 8


class TestAvx2Conformance(BackendConformance):
    backend_name = "avx2"
    d_models = (16, 32, 64, 128)
