"""Measure what the kit's trajectory check bounds, for backends that are right: how far their training runs
land from numpy_ref float64 in windows restarted from the reference's states and over a whole run.

    python benchmarks/trajectory_spread.py avx512,avx2,numpy_ref:float32
    OPENBLAS_CORETYPE=Haswell python benchmarks/trajectory_spread.py numpy_ref:float32   # other BLAS kernels
    python benchmarks/trajectory_spread.py numpy_ref:float32 --smoke   # seconds: d16, a 20-step run

Inputs, windows and learning rates are the kit's defaults (eemicrogpt_core.kit.conformance.BackendConformance).
docs/testing-trajectories.md records the figures and the bounds derived from them.
"""

from __future__ import annotations

import argparse

import numpy as np

from eemicrogpt_core.backends.backend import TrainState
from eemicrogpt_core.backends.registry import load_registry, open_session
from eemicrogpt_core.kit.conformance import BackendConformance, relative_errors


def spread(kit: BackendConformance, backend: str, dtype: str, d_model: int) -> str:
    state, tokens, lengths, lrs = kit.trajectory_inputs(d_model)
    want, ref_states = kit.reference_trajectory(d_model)
    session = open_session(load_registry().get(backend), kit.shape(d_model), kit.batch, dtype)
    loss_err, params_err = 0.0, 0.0
    for start, w in kit.trajectory_windows_at():
        begin, end = ref_states[start], ref_states[start + w]
        session.set_state(TrainState(*(a.astype(dtype) for a in (begin.params, begin.adam_m, begin.adam_v)),
                                     begin.step))
        got = session.train_steps(tokens[start:start + w], lengths[start:start + w], lrs[start:start + w])
        loss_err = max(loss_err, float(np.max(np.abs(got - want[start:start + w]))))
        change = session.get_state().params.astype(np.float64) - begin.params
        params_err = max(params_err, relative_errors(change, end.params - begin.params)[0])
    session.set_state(state)
    got = session.train_steps(tokens, lengths, lrs).astype(np.float64)
    session.close()
    n = len(got)
    quarters = [abs(got[q * n // 4:(q + 1) * n // 4].mean() - want[q * n // 4:(q + 1) * n // 4].mean())
                for q in range(4)]
    step = np.abs(got - want)
    return (f"d{d_model} {backend}:{dtype}: window loss {loss_err:.1e}, window parameter change {params_err:.1e}"
            f" | whole run: quarter means {max(quarters):.1e}, largest step {step.max():.1e}"
            f" (step {int(step.argmax()) + 1})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("backends", help="comma list of NAME or NAME:DTYPE (default dtype float32)")
    parser.add_argument("--d-models", default="16,32,64,128")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run that proves the script works (d16, 20 steps, two 5-step windows); its "
                             "figures are not the kit's")
    args = parser.parse_args(argv)
    kit = BackendConformance()
    if args.smoke:
        args.d_models = "16"
        kit.trajectory_steps, kit.trajectory_windows, kit.trajectory_window_steps = 20, 2, 5
    for d_model in (int(d) for d in args.d_models.split(",")):
        for item in args.backends.split(","):
            name, dtype = [*item.split(":"), "float32"][:2]
            print(spread(kit, name, dtype, d_model), flush=True)


if __name__ == "__main__":
    main()
