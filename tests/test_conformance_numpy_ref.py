"""numpy_ref through the conformance kit: its float32 path checked against its own float64 path."""

from eemicrogpt_core.testing import BackendConformance


class TestNumpyRefConformance(BackendConformance):
    backend_name = "numpy_ref"
    # The kit's default trajectory reference is numpy_ref float32, i.e. this very code: compare to float64.
    trajectory_reference_dtype = "float64"
