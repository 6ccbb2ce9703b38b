"""The conformance kit against example_py: everything the core expects of a backend, in a few lines."""

from __future__ import annotations

from eemicrogpt_core.kit.conformance import BackendConformance


class TestExamplePyConformance(BackendConformance):
    backend_name = "example_py"
    # float32 like numpy_ref, summed one sequence at a time. Over the kit's 200 steps on real names it tracks
    # numpy_ref float64 within 2.4e-7 at d16-d64 and 1.1e-3 at d128, whereas numpy_ref float32 itself drifts
    # 1.3e-2 from float64 at d32 (step 145, a rounding-level fork): compare with the float64 reference.
    trajectory_reference_dtype = "float64"
