"""YAML configs: the built-in default and presets match configs/, and every bad value names key and file."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from eemicrogpt_core import config as config_module
from eemicrogpt_core.config import PRESETS, TrainConfig, load_config, preset, resolve_backend
from eemicrogpt_core.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_builtin_default_is_configs_d64() -> None:
    assert load_config(None) == TrainConfig()
    assert load_config(CONFIGS / "d64.yaml") == TrainConfig()


@pytest.mark.parametrize("d_model", sorted(PRESETS))
def test_config_files_match_presets(d_model: int) -> None:
    cfg = load_config(CONFIGS / f"d{d_model}.yaml")
    assert cfg == preset(d_model)
    assert cfg.d_model == d_model and cfg.batch == 16
    assert cfg.n_heads == (8 if d_model == 128 else 4)


def test_every_field_has_a_type() -> None:
    assert set(config_module._FIELD_TYPES) == {f.name for f in dataclasses.fields(TrainConfig)}


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_unknown_key_names_key_file_and_suggestion(tmp_path: Path) -> None:
    path = _write(tmp_path, "d_model: 16\nlearning_rate: 0.1\n")
    with pytest.raises(ConfigError, match=r"run\.yaml: unknown key 'learning_rate'.*valid keys") as err:
        load_config(path)
    assert "d_model" in str(err.value)
    with pytest.raises(ConfigError, match="did you mean 'n_heads'"):
        load_config(_write(tmp_path, "n_head: 4\n"))


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("d_model: sixteen\n", r"run\.yaml: d_model must be an integer, got str"),
        ("d_model: 16.5\n", r"d_model must be an integer, got float"),
        ("batch: true\n", r"batch must be an integer, got bool"),
        ("lr: '0.1'\n", r"lr must be a number, got str"),
        ("drop_invalid: 1\n", r"drop_invalid must be true or false"),
        ("data: [a, b]\n", r"data must be a string or null"),
    ],
)
def test_wrong_types(tmp_path: Path, text: str, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        load_config(_write(tmp_path, text))


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("d_model: 30\nn_heads: 4\n", r"run\.yaml: n_heads must divide d_model 30"),
        ("d_model: 12\nn_heads: 4\n", r"n_heads leaves head_dim 3"),
        ("batch: 0\n", r"run\.yaml: batch must be >= 1, got 0"),
        ("lr: -0.001\n", r"run\.yaml: lr must be a finite number >= 0"),
        ("steps: 0\n", r"steps must be >= 1"),
        ("val_fraction: 1.0\n", r"val_fraction must be in \[0, 1\) \(0: no validation split\), got 1\.0"),
        ("val_fraction: -0.1\n", r"val_fraction must be in \[0, 1\)"),
        ("n_layers: 0\n", r"run\.yaml: n_layers must be 1\.\.8, got 0"),
        ("n_layers: 9\n", r"n_layers must be 1\.\.8, got 9"),
        ("context: 0\n", r"run\.yaml: context must be 1\.\.64, got 0"),
        ("context: 65\n", r"context must be 1\.\.64, got 65"),
        ("lowercase: 1\n", r"lowercase must be true or false"),
        ("time_budget: 0\n", r"time_budget must be a positive number"),
        ("dtype: int8\n", r"dtype must be one of float32, float64, float16"),
        ("seed: -1\n", r"seed must be >= 0"),
        ("backend: ''\n", r"backend must be a backend name"),
    ],
)
def test_impossible_values(tmp_path: Path, text: str, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        load_config(_write(tmp_path, text))


def test_int_is_accepted_for_float_keys(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, "lr: 1\ntime_budget: 5\n"))
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float) and cfg.time_budget == 5.0


def test_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "d_model: 16\nlr: [0.1\nbatch: 4\n")
    with pytest.raises(ConfigError, match=r"run\.yaml:\d+: malformed YAML"):
        load_config(path)


def test_non_mapping_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(_write(tmp_path, "- 1\n- 2\n"))
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.yaml")
    assert load_config(_write(tmp_path, "# only a comment\n")) == TrainConfig()


def test_command_line_overrides_yaml_and_is_named_in_errors(tmp_path: Path) -> None:
    path = _write(tmp_path, "d_model: 64\nlr: 0.003\n")
    cfg = load_config(path, {"lr": 0.02, "steps": None})
    assert (cfg.d_model, cfg.lr, cfg.steps) == (64, 0.02, TrainConfig().steps)
    with pytest.raises(ConfigError, match=r"command line: batch must be >= 1"):
        load_config(path, {"batch": 0})
    with pytest.raises(ConfigError, match=r"command line: n_heads must divide d_model 64"):
        load_config(path, {"n_heads": 5})


def test_backend_precedence() -> None:
    env = {"EEMICROGPT_BACKEND": "avx2"}
    assert resolve_backend("numpy_ref", "avx512", env) == "numpy_ref"
    assert resolve_backend(None, "avx512", env) == "avx2"
    assert resolve_backend(None, "avx512", {}) == "avx512"
    assert resolve_backend(None, "auto", {"EEMICROGPT_BACKEND": " "}) == "auto"


def test_preset_for_unknown_size() -> None:
    with pytest.raises(ConfigError, match="no preset for d_model 48"):
        preset(48)
