"""numpy_ref through the conformance kit: its float32 path checked against its own float64 path (the
kit's reference)."""

from eemicrogpt_core.kit.conformance import BackendConformance


class TestNumpyRefConformance(BackendConformance):
    backend_name = "numpy_ref"
