"""keep_best (best.npz) and patience (early stopping): what is kept, when a run stops, and how resume and
--steps treat a run that stopped early."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from reporters import Messages, StopAt
from typer.testing import CliRunner

import eemicrogpt
from eemicrogpt_core.backends.registry import BackendRegistry
from eemicrogpt_core.base.errors import CheckpointError, ConfigError
from eemicrogpt_core.interface import cli
from eemicrogpt_core.training import runs
from eemicrogpt_core.training.checkpoint import load_checkpoint, save_checkpoint
from eemicrogpt_core.training.config import TrainConfig, build_config
from eemicrogpt_core.training.rundir import RunDir, model_file
from eemicrogpt_core.training.trainer import train


@pytest.fixture(scope="module")
def cfg(names_file: Path) -> TrainConfig:
    return TrainConfig(d_model=16, steps=200, lr=0.01, backend="numpy_ref", data=str(names_file),
                       log_every=20, chunk_steps=25, eval_batches=4)


def test_keep_best_holds_the_lowest_validation_loss(registry: BackendRegistry, cfg: TrainConfig,
                                                    tmp_path: Path) -> None:
    # A constant lr of 0.05 (min_lr = lr) is noisy enough for d16 that the last rounds are not the best
    # (measured on numpy_ref: best at step 160 of 200); the asserts hold wherever the best falls.
    cfg = dataclasses.replace(cfg, keep_best=True, lr=0.05, min_lr=0.05)
    run = RunDir.create(str(tmp_path / "run"), cfg)
    result = train(cfg, registry, run_dir=run)
    vals = [(r["val_loss"], r["step"]) for r in run.read_metrics()]
    best_loss, best_step = min(vals)  # ties: the earliest, since later rounds must be strictly lower
    assert result.best is not None and (result.best.val_loss, result.best.step) == (best_loss, best_step)
    best = load_checkpoint(run.best_path)
    assert best.state.step == best_step and best.best.val_loss == best_loss
    last = load_checkpoint(run.checkpoint_path)
    assert last.state.step == 200 and last.best.step == best_step
    assert model_file(run.path, best=True) == run.best_path and model_file(run.path) == run.checkpoint_path
    assert best_step < 200 and not np.array_equal(best.state.params, last.state.params)
    loaded = eemicrogpt.load(run.path, best=True)
    assert loaded.step == best_step and np.array_equal(loaded.params, best.state.params)


def test_patience_stops_and_says_so(registry: BackendRegistry, cfg: TrainConfig, tmp_path: Path) -> None:
    # lr 0: every round's validation loss equals the first, which no later round beats.
    cfg = dataclasses.replace(cfg, lr=0.0, patience=3)
    run = RunDir.create(str(tmp_path / "run"), cfg)
    reporter = Messages()
    result = train(cfg, registry, run_dir=run, reporter=reporter)
    assert int(result.state.step) == 80 and not result.interrupted  # rounds at 20 (best), 40, 60, 80
    assert any(line.startswith("stopped early at step 80: the validation loss has not improved for 3 validation "
                               "rounds (best val loss") for line in reporter.messages), reporter.messages
    assert not run.best_path.exists()  # patience alone keeps no best.npz
    ckpt = load_checkpoint(run.checkpoint_path)
    assert ckpt.finished and ckpt.best.stopped_at == 80 and ckpt.best.step == 20
    finished = runs.plan_resume(registry, run.path)
    assert isinstance(finished, runs.AlreadyFinished)
    assert "stopped early at step 80" in finished.describe()
    # --steps extends it: rounds are counted afresh, so it trains 3 more rounds and stops again.
    plan = runs.plan_resume(registry, run.path, extend_to=400)
    assert isinstance(plan, runs.RunPlan)
    more = runs.execute(plan, registry)
    assert int(more.state.step) == 140 and more.best is not None and more.best.stopped_at == 140


def test_resumed_run_counts_rounds_on(registry: BackendRegistry, cfg: TrainConfig, tmp_path: Path) -> None:
    cfg = dataclasses.replace(cfg, lr=0.0, patience=4, keep_best=True)
    whole = train(cfg, registry, run_dir=RunDir.create(str(tmp_path / "whole"), cfg))
    run = RunDir.create(str(tmp_path / "split"), cfg)
    first = train(cfg, registry, run_dir=run, reporter=StopAt(45))
    assert first.interrupted and int(first.state.step) < 100
    ckpt = load_checkpoint(run.checkpoint_path)
    assert ckpt.best.stale_rounds >= 1 and not ckpt.finished
    second = train(ckpt.config, registry, run_dir=RunDir.existing(run.path), resume=ckpt)
    assert int(second.state.step) == int(whole.state.step) == 100
    assert second.best == whole.best and load_checkpoint(run.best_path).state.step == 20


def test_best_needs_a_validation_split() -> None:
    for key, value in (("keep_best", True), ("patience", 2)):
        with pytest.raises(ConfigError, match=f"t.yaml: {key} needs a validation split"):
            build_config([("t.yaml", {key: value, "val_fraction": 0})])
    with pytest.raises(ConfigError, match="patience must be >= 1"):
        build_config([("t.yaml", {"patience": 0})])


def test_a_damaged_best_record_is_refused(registry: BackendRegistry, cfg: TrainConfig, tmp_path: Path) -> None:
    cfg = dataclasses.replace(cfg, steps=20, patience=2)
    run = RunDir.create(str(tmp_path / "run"), cfg)
    train(cfg, registry, run_dir=run)
    ckpt = load_checkpoint(run.checkpoint_path)
    save_checkpoint(run.checkpoint_path, dataclasses.replace(ckpt, best=dataclasses.replace(ckpt.best, step=999)))
    with pytest.raises(CheckpointError, match=r"damaged best-loss record: step must be an integer in 0\.\.20"):
        load_checkpoint(run.checkpoint_path)


def test_cli_best_flags(names_file: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    env = {"EEMICROGPT_BACKEND": None, "EEMICROGPT_DATA": None}
    out = tmp_path / "run"
    common = ["--backend", "numpy_ref", "--data", str(names_file), "--d-model", "16", "--log-every", "50"]
    result = runner.invoke(cli.app, ["train", *common, "--steps", "100", "--keep-best", "--out", str(out)], env=env)
    assert result.exit_code == 0, result.output
    assert f"(kept in {out / 'best.npz'})" in result.output
    sampled = runner.invoke(cli.app, ["sample", str(out), "--best", "-n", "3"], env=env)
    # one line a name: a 100-step model may draw the empty name, an empty line
    assert sampled.exit_code == 0 and len(sampled.stdout.splitlines()) == 3
    exported = runner.invoke(cli.app, ["export", str(out), "--best", "--out", str(tmp_path / "b.safetensors")])
    assert exported.exit_code == 0 and (tmp_path / "b.safetensors").is_file()
    evaluated = runner.invoke(cli.app, ["eval", str(out), "--best", "--data", str(names_file)], env=env)
    assert evaluated.exit_code == 0 and "loss " in evaluated.stdout, evaluated.output
    plain = tmp_path / "plain"
    assert runner.invoke(cli.app, ["train", *common, "--steps", "50", "--out", str(plain)], env=env).exit_code == 0
    refused = runner.invoke(cli.app, ["sample", str(plain), "--best"], env=env)
    assert refused.exit_code == 2
    refused_eval = runner.invoke(cli.app, ["eval", str(plain), "--best", "--data", str(names_file)], env=env)
    assert refused_eval.exit_code == 2 and refused_eval.stderr == refused.stderr
    assert refused.stderr.strip() == (f"eemicrogpt: error: {plain} has no best.npz: the run was trained without "
                                      "keep_best (train with --keep-best to keep the checkpoint of the lowest "
                                      "validation loss)")
