"""Time-budget runs say whether the machine was busy (contention.py), from numbers the test chooses."""

from __future__ import annotations

from pathlib import Path

from eemicrogpt_core.backends.registry import load_registry
from eemicrogpt_core.kit.conformance import names_file
from eemicrogpt_core.training.config import build_config
from eemicrogpt_core.training.contention import SLOWDOWN_LIMIT, Contention
from eemicrogpt_core.training.trainer import train


def test_quiet_and_busy_verdicts() -> None:
    quiet = Contention(load_start=0.9, load_end=1.1, calibration_us=100.0, us_per_step=105.0, cpus=2)
    assert not quiet.contended and quiet.as_record()["contended"] is False
    slow = Contention(0.9, 1.0, 100.0, 100.0 * SLOWDOWN_LIMIT + 1, 2)
    assert slow.contended
    loaded = Contention(3.2, 1.0, 100.0, 101.0, 2)  # a third runnable thread on two CPUs
    assert loaded.contended
    unknown_load = Contention(None, None, 100.0, 101.0, 2)
    assert not unknown_load.contended


def test_a_time_budget_run_records_its_contention(tmp_path: Path) -> None:
    cfg = build_config([("test", {"d_model": 16, "time_budget": 0.5, "log_every": 10**6, "backend": "numpy_ref",
                                  "data": str(names_file()), "threads": 1})])
    result = train(cfg, load_registry())
    c = result.contention
    assert c is not None and c.calibration_us > 0 and c.us_per_step > 0
    assert isinstance(c.contended, bool)
    fixed = build_config([("test", {"d_model": 16, "steps": 5, "backend": "numpy_ref", "data": str(names_file())})])
    assert train(fixed, load_registry()).contention is None
