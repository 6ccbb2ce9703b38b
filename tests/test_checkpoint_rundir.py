"""Run directories: default names, refusing to overwrite a run, finding one to resume, metrics trimming."""

from __future__ import annotations

from pathlib import Path

import pytest

from eemicrogpt_core.base.errors import CheckpointError
from eemicrogpt_core.training.config import TrainConfig
from eemicrogpt_core.training.rundir import RunDir


def test_default_names_are_unique(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    a, b = RunDir.create(None, TrainConfig()), RunDir.create(None, TrainConfig(d_model=16))
    c = RunDir.create(None, TrainConfig())
    assert a.path.parent == Path("runs") and a.path.name.endswith("-d64") and b.path.name.endswith("-d16")
    assert c.path != a.path and a.path.is_dir() and c.path.is_dir()


def test_refuses_a_directory_holding_a_run(tmp_path: Path) -> None:
    run = RunDir.create(str(tmp_path / "r"), TrainConfig())
    run.checkpoint_path.write_bytes(b"x")
    with pytest.raises(CheckpointError, match="already holds a run; continue it with --resume"):
        RunDir.create(str(tmp_path / "r"), TrainConfig())
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError, match="is not a directory"):
        RunDir.create(str(tmp_path / "file"), TrainConfig())


def test_existing_needs_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="run directory not found"):
        RunDir.existing(tmp_path / "absent")
    with pytest.raises(CheckpointError, match=r"has no checkpoint\.npz"):
        RunDir.existing(tmp_path)


def test_metrics_are_trimmed_to_the_checkpoint(tmp_path: Path) -> None:
    run = RunDir.create(str(tmp_path / "r"), TrainConfig())
    for step in (10, 20, 30):
        run.append_metric({"step": step, "train_loss": 2.0})
    run.keep_metrics_until(20)
    assert [r["step"] for r in run.read_metrics()] == [10, 20]
    run.write_config(TrainConfig(d_model=16))
    assert "d_model: 16" in run.config_path.read_text()
