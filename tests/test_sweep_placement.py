"""Worker placement: one worker per physical core first, pinning, BLAS threads 1; the ETA."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from eemicrogpt_core.sweep.local import worker_env
from eemicrogpt_core.sweep.placement import THREAD_ENV_VARS, place_workers
from eemicrogpt_core.sweep.progress import eta_seconds


def test_workers_take_one_cpu_per_core_first() -> None:
    cores = [[0, 2], [1, 3]]  # two cores with two SMT siblings each (topology.physical_cores)
    default = place_workers(None, cores)
    assert default.cpus == [[0], [1]] and not default.shared
    assert "2 workers on 2 physical cores" in default.describe() and "SHARE" not in default.describe()
    crowded = place_workers(3, cores)
    assert crowded.cpus == [[0], [1], [2]] and crowded.shared  # the third worker lands on core 0's sibling
    assert "WORKERS SHARE A CORE" in crowded.describe()


def test_a_worker_pins_itself_and_gets_one_blas_thread() -> None:
    cpu = min(os.sched_getaffinity(0))
    env = worker_env()
    assert all(env[var] == "1" for var in THREAD_ENV_VARS)
    code = ("import os, sys; print(os.environ['OPENBLAS_NUM_THREADS'], os.environ['OMP_NUM_THREADS'], file=sys.stderr)")
    probe = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert probe.stderr.split() == ["1", "1"]
    proc = subprocess.Popen([sys.executable, "-m", "eemicrogpt_core.sweep.worker", "--cpus", str(cpu)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        hello = json.loads(proc.stdout.readline())
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    assert hello["ready"] and hello["cpus"] == [cpu]
    assert proc.returncode == 0


@pytest.mark.parametrize(("durations", "remaining", "running", "slots", "expected"), [
    ([], 5, 1, 2, None),
    ([2.0, 4.0], 4, 0, 2, 6.0),  # 4 runs of 3 s on 2 slots
    ([3.0], 0, 2, 2, 1.5),  # two half-done runs
])
def test_eta(durations: list[float], remaining: int, running: int, slots: int, expected: float | None) -> None:
    assert eta_seconds(durations, remaining, running, slots) == expected
