"""Time-budget runs say whether the machine was busy (contention.py): the verdict for constructed loads and step
times, and a real run's record built from the loads the OS reported and the times it measured."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from eemicrogpt_core.backends.registry import load_registry
from eemicrogpt_core.kit.conformance import names_file
from eemicrogpt_core.training import trainer
from eemicrogpt_core.training.config import build_config
from eemicrogpt_core.training.contention import SLOWDOWN_LIMIT, Contention
from eemicrogpt_core.training.trainer import train

CALIBRATION_US = 100.0


@pytest.mark.parametrize(("load_start", "load_end", "us_per_step", "contended"), [
    (0.3, 0.4, CALIBRATION_US, False),  # a quiet run at its calibrated speed
    (0.9, 1.1, 1.05 * CALIBRATION_US, False),  # within the warm-up's own spread
    (4.0, 4.2, 2 * CALIBRATION_US, True),  # twice the calibrated step time on a loaded machine
    (0.3, 0.4, 2 * CALIBRATION_US, True),  # twice as slow, whatever the load says
    (3.2, 1.0, 1.01 * CALIBRATION_US, True),  # a third runnable thread on two CPUs at the start
    (1.0, 3.2, 1.01 * CALIBRATION_US, True),  # ... or at the end
    (2.5, 2.5, SLOWDOWN_LIMIT * CALIBRATION_US, False),  # both limits are strict: exactly at them is quiet
    (None, None, 1.01 * CALIBRATION_US, False),  # no load average on this OS: the step rate decides
    (None, None, 2 * CALIBRATION_US, True),
])
def test_the_verdict_for_constructed_runs(load_start: float | None, load_end: float | None, us_per_step: float,
                                          contended: bool) -> None:
    c = Contention(load_start, load_end, CALIBRATION_US, us_per_step, cpus=2)
    assert c.contended is contended
    assert c.slowdown == pytest.approx(us_per_step / CALIBRATION_US)
    record = c.as_record()
    assert record["contended"] is contended and record["load_start"] == load_start
    assert record["slowdown"] == round(us_per_step / CALIBRATION_US, 3)


def _time_budget_run(monkeypatch: pytest.MonkeyPatch, load: float) -> Contention:
    loads: Iterator[float] = iter([load, load + 0.25])  # read once before the run and once after it
    monkeypatch.setattr(trainer, "load_average", lambda: next(loads))
    cfg = build_config([("test", {"d_model": 16, "time_budget": 0.5, "log_every": 10**6, "backend": "numpy_ref",
                                  "data": str(names_file()), "threads": 1})])
    c = train(cfg, load_registry()).contention
    assert c is not None and c.calibration_us > 0 and c.us_per_step > 0
    assert (c.load_start, c.load_end) == (load, load + 0.25)
    return c


def test_a_time_budget_run_on_a_loaded_machine_is_contended(monkeypatch: pytest.MonkeyPatch) -> None:
    c = _time_budget_run(monkeypatch, load=64.0)  # far more runnable threads than any CPU count
    assert c.contended is True and c.as_record()["contended"] is True


def test_a_time_budget_run_without_load_is_judged_by_its_step_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    c = _time_budget_run(monkeypatch, load=0.0)
    # The machine's real speed varies, so the verdict is checked against the run's own measured slowdown.
    assert c.contended is (c.slowdown > SLOWDOWN_LIMIT)


def test_a_fixed_step_run_has_no_contention_record() -> None:
    fixed = build_config([("test", {"d_model": 16, "steps": 5, "backend": "numpy_ref", "data": str(names_file())})])
    assert train(fixed, load_registry()).contention is None
