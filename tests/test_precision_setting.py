"""The `precision` setting: config key, `--precision`, and that it reaches backend selection before any work."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from eemicrogpt_core.base.errors import ConfigError
from eemicrogpt_core.interface import cli
from eemicrogpt_core.training.config import load_config


def test_config_key(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("precision: bf16\n")
    assert load_config(path).precision == "bf16"
    path.write_text("precision: null\n")
    assert load_config(path).precision is None
    path.write_text("precision: fp64\n")
    with pytest.raises(ConfigError, match=r"precision must be one of fp32, bf16, fp16 \(or null\), got 'fp64'"):
        load_config(path)
    path.write_text("precision: 16\n")
    with pytest.raises(ConfigError, match="precision must be a string or null"):
        load_config(path)


def test_train_refuses_a_backend_of_another_precision_before_creating_the_run(
    tmp_path: Path, names_file: Path
) -> None:
    out = tmp_path / "run"
    result = CliRunner().invoke(cli.app, [
        "train", "--backend", "numpy_ref", "--precision", "bf16", "--d-model", "16", "--steps", "5",
        "--data", str(names_file), "--out", str(out),
    ])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert "backend 'numpy_ref' computes in fp32, not the requested precision bf16" in line
    assert not out.exists()


def test_train_with_auto_and_fp32_records_the_setting(tmp_path: Path, names_file: Path) -> None:
    out = tmp_path / "run"
    result = CliRunner().invoke(cli.app, [
        "train", "--precision", "fp32", "--d-model", "16", "--steps", "3", "--log-every", "3",
        "--data", str(names_file), "--out", str(out),
    ])
    assert result.exit_code == 0, result.output
    assert load_config(out / "config.yaml").precision == "fp32"
