"""The learning-rate schedule: the default is the old linear decay to the bit; warm-up, cosine and min_lr
follow their formulas; a resumed or extended run continues the schedule exactly."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from reporters import StopAt

from eemicrogpt_core.backends.registry import BackendRegistry
from eemicrogpt_core.base.errors import ConfigError
from eemicrogpt_core.model.optim import LrSchedule, lr_schedule
from eemicrogpt_core.training.checkpoint import load_checkpoint
from eemicrogpt_core.training.config import TrainConfig, build_config
from eemicrogpt_core.training.rundir import RunDir
from eemicrogpt_core.training.trainer import train


def old_linear(first_step: int, n: int, total_steps: int, lr0: float) -> np.ndarray:
    """The schedule as it was written before warm-up, cosine and min_lr existed."""
    steps = np.arange(first_step, first_step + n, dtype=np.float64)
    return (lr0 * (1.0 - (steps - 1) / total_steps)).astype(np.float32)


@pytest.fixture(scope="module")
def cfg(names_file: Path) -> TrainConfig:
    return TrainConfig(d_model=16, steps=60, lr=0.01, backend="numpy_ref", data=str(names_file),
                       log_every=30, chunk_steps=25, eval_batches=4)


@pytest.mark.parametrize(("first", "n", "total", "lr"), [
    (1, 40000, 40000, 0.002), (1, 20000, 20000, 0.01), (12345, 777, 30000, 0.005), (1, 7, 7, 0.003),
    (9001, 1000, 10**6, 1e-3), (1, 1, 1, 0.1)])
def test_default_schedule_is_the_old_linear_decay_bit_for_bit(first: int, n: int, total: int, lr: float) -> None:
    old = old_linear(first, n, total, lr)
    for new in (TrainConfig(lr=lr).schedule().rates(first, n, total), lr_schedule(first, n, total, lr)):
        assert new.dtype == np.float32
        assert np.array_equal(new.view(np.uint32), old.view(np.uint32))


def test_default_run_trains_the_old_schedules_losses(registry: BackendRegistry, cfg: TrainConfig,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    new = train(cfg, registry)

    def old_rates(self: LrSchedule, first: int, n: int, total: int) -> np.ndarray:
        return old_linear(first, n, total, self.lr)

    monkeypatch.setattr(LrSchedule, "rates", old_rates)
    old = train(cfg, registry)
    assert np.array_equal(new.losses, old.losses) and np.array_equal(new.state.params, old.state.params)
    assert new.records == [dict(r, elapsed_s=n["elapsed_s"], us_per_step=n["us_per_step"])
                           for r, n in zip(old.records, new.records, strict=True)]


def test_warmup_then_cosine_to_min_lr() -> None:
    s = LrSchedule(0.01, "cosine", warmup_steps=10, min_lr=0.001)
    lrs = s.rates(1, 110, 110).astype(np.float64)
    assert np.allclose(lrs[:10], 0.01 * np.arange(1, 11) / 10, rtol=1e-6)  # the ramp reaches lr at its last step
    assert lrs[10] == pytest.approx(0.01, rel=1e-6)  # the first decay step
    assert lrs[10 + 50] == pytest.approx((0.01 + 0.001) / 2, rel=1e-6)  # halfway through the 100 decay steps
    assert np.all(np.diff(lrs[10:]) < 0) and lrs[-1] > 0.001
    assert lrs[-1] == pytest.approx(0.001 + 0.009 * 0.5 * (1 + math.cos(math.pi * 99 / 100)), rel=1e-6)


def test_linear_to_a_floor_and_chunks_agree() -> None:
    s = LrSchedule(0.004, "linear", warmup_steps=3, min_lr=0.001)
    whole = s.rates(1, 50, 50)
    assert np.array_equal(np.concatenate([s.rates(1, 17, 50), s.rates(18, 33, 50)]), whole)
    assert whole[3] == np.float32(0.004) and whole[-1] == np.float32(0.001 + 0.003 * (1 - 46 / 47))
    assert s.at(50, 50) == whole[-1]


@pytest.mark.parametrize(("keys", "message"), [
    ({"min_lr": 0.02, "lr": 0.01}, "min_lr must be at most lr"),
    ({"warmup_steps": 100, "steps": 100}, "warmup_steps must be fewer than steps"),
    ({"lr_schedule": "step"}, "lr_schedule must be one of linear, cosine"),
    ({"warmup_steps": -1}, "warmup_steps must be >= 0"),
])
def test_impossible_schedules_are_refused(keys: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_config([("test.yaml", keys)])


def test_a_clash_between_two_sources_names_both() -> None:
    layers = [("shakespeare.yaml", {"warmup_steps": 100, "steps": 5000}), ("command line", {"steps": 30})]
    with pytest.raises(ConfigError) as raised:
        build_config(layers)
    assert str(raised.value) == ("shakespeare.yaml: warmup_steps must be fewer than steps (30, from command line), "
                                 "got 100")
    with pytest.raises(ConfigError) as raised:  # one source: nothing to add
        build_config([("t.yaml", {"min_lr": 0.02, "lr": 0.01})])
    assert str(raised.value) == "t.yaml: min_lr must be at most lr (0.01), got 0.02"


def test_warmup_longer_than_a_time_budget_is_allowed() -> None:
    assert build_config([("t", {"warmup_steps": 500, "steps": 100, "time_budget": 1.0})]).warmup_steps == 500


def test_interrupted_cosine_run_resumes_bit_for_bit(registry: BackendRegistry, cfg: TrainConfig,
                                                   tmp_path: Path) -> None:
    cfg = dataclasses.replace(cfg, lr_schedule="cosine", warmup_steps=8, min_lr=0.002)
    whole = train(cfg, registry, run_dir=RunDir.create(str(tmp_path / "whole"), cfg))
    run = RunDir.create(str(tmp_path / "split"), cfg)
    first = train(cfg, registry, run_dir=run, reporter=StopAt(25))
    assert first.interrupted and first.steps_run < 60
    ckpt = load_checkpoint(run.checkpoint_path)
    assert ckpt.config.schedule() == cfg.schedule()  # the checkpoint carries the schedule
    second = train(ckpt.config, registry, run_dir=RunDir.existing(run.path), resume=ckpt)
    assert np.array_equal(np.concatenate([first.losses, second.losses]), whole.losses)
    assert np.array_equal(second.state.params, whole.state.params)
    assert [r["lr"] for r in run.read_metrics()] == [r["lr"] for r in whole.records]
    assert whole.records[-1]["lr"] == cfg.schedule().at(60, 60)


def test_extension_respans_the_schedule(registry: BackendRegistry, cfg: TrainConfig, tmp_path: Path) -> None:
    cfg = dataclasses.replace(cfg, lr_schedule="cosine", warmup_steps=5, min_lr=0.001, log_every=20)
    run = RunDir.create(str(tmp_path / "run"), cfg)
    train(cfg, registry, run_dir=run)
    ckpt = load_checkpoint(run.checkpoint_path)
    more = train(ckpt.config, registry, run_dir=RunDir.existing(run.path), resume=ckpt, extend_to=100)
    assert [r["step"] for r in more.records] == [80, 100]
    assert [r["lr"] for r in more.records] == [cfg.schedule().at(s, 100) for s in (80, 100)]
