"""YAML configs: the built-in default and presets match the shipped dNN configs, and every bad value names key and
file."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from eemicrogpt_core.base import abi
from eemicrogpt_core.base.errors import ConfigError
from eemicrogpt_core.base.shipped import SHIPPED_DIR
from eemicrogpt_core.training import config as config_module
from eemicrogpt_core.training.config import PRESETS, TrainConfig, load_config, preset, resolve_backend

CONFIGS = SHIPPED_DIR


def test_builtin_default_is_configs_d64() -> None:
    assert load_config(None) == TrainConfig()
    assert load_config(CONFIGS / "d64.yaml") == TrainConfig()


@pytest.mark.parametrize("d_model", sorted(PRESETS))
def test_config_files_match_presets(d_model: int) -> None:
    cfg = load_config(CONFIGS / f"d{d_model}.yaml")
    assert cfg == preset(d_model)
    assert cfg.d_model == d_model and cfg.batch == 16
    assert cfg.n_heads == (8 if d_model == 128 else 4)


def test_types_come_from_the_field_annotations() -> None:
    types = config_module.FIELD_TYPES
    assert set(types) == {f.name for f in dataclasses.fields(TrainConfig)} == set(config_module.SETTINGS)
    assert types["d_model"] == (int,) and types["lowercase"] == (bool,) and types["val_fraction"] == (float,)
    assert types["time_budget"] == (float, type(None)) and types["precision"] == (str, type(None))


def test_a_field_without_a_setting_is_refused() -> None:
    @dataclasses.dataclass
    class Partial:
        a: int = config_module._key(1, "documented")
        b: int = 2

    with pytest.raises(TypeError, match=r"Partial\.b has no Setting"):
        config_module.settings_of(Partial)


def test_depth_and_context_bounds_are_the_c_abis() -> None:
    assert (abi.MAX_LAYERS, abi.MAX_CONTEXT) == (12, 256)  # the ABI's bounds (backends say what they run)
    cfg = load_config(None, {"n_layers": 8, "context": 64})
    assert (cfg.n_layers, cfg.context) == (8, 64)
    assert (TrainConfig().n_layers, TrainConfig().context, TrainConfig().lowercase) == (1, 16, False)
    with pytest.raises(ConfigError, match=r"^command line: n_layers must be 1\.\.12, got 13$"):
        load_config(None, {"n_layers": 13})
    with pytest.raises(ConfigError, match=r"^command line: context must be 1\.\.256, got 257$"):
        load_config(None, {"context": 257})


@pytest.mark.parametrize("value", [0, 0.0, 0.5, 0.999])
def test_val_fraction_may_be_zero(value: float) -> None:
    assert load_config(None, {"val_fraction": value}).val_fraction == value


@pytest.mark.parametrize("value", [1, 1.0, -0.1, float("nan"), float("inf")])
def test_val_fraction_outside_zero_to_one(value: float) -> None:
    with pytest.raises(ConfigError, match=r"^command line: val_fraction must be a finite number in \[0, 1\), got"):
        load_config(None, {"val_fraction": value})


def _resolved(tmp_path: Path, text: str | None, flags: dict[str, object]) -> TrainConfig:
    return load_config(_write(tmp_path, text) if text is not None else None, flags)


def test_a_width_brings_its_preset_for_the_values_not_given(tmp_path: Path) -> None:
    assert _resolved(tmp_path, None, {"d_model": 32}) == preset(32)
    assert _resolved(tmp_path, "d_model: 128\n", {}) == preset(128)
    # flags > config file > the chosen width's preset > built-in default
    cfg = _resolved(tmp_path, "d_model: 32\nlr: 0.001\n", {"steps": 77})
    assert (cfg.d_model, cfg.lr, cfg.steps, cfg.n_heads) == (32, 0.001, 77, PRESETS[32]["n_heads"])
    assert cfg.batch == TrainConfig().batch  # not in the preset: the built-in default
    cfg = _resolved(tmp_path, "d_model: 128\nn_heads: 4\nlr: 0.001\n", {"lr": 0.02})
    assert (cfg.n_heads, cfg.lr, cfg.steps) == (4, 0.02, PRESETS[128]["steps"])
    # the flag chooses the width, so its preset applies beneath the file's other values
    cfg = _resolved(tmp_path, "d_model: 128\nbatch: 8\n", {"d_model": 16})
    assert (cfg.d_model, cfg.n_heads, cfg.lr, cfg.steps, cfg.batch) == (16, 4, 0.01, 20000, 8)
    # a width without a preset keeps the built-in default's values
    cfg = _resolved(tmp_path, None, {"d_model": 48})
    assert (cfg.lr, cfg.steps, cfg.n_heads) == (TrainConfig().lr, TrainConfig().steps, TrainConfig().n_heads)


def test_a_saved_config_is_not_given_presets() -> None:
    # build_config (checkpoints, sweep runs) applies exactly its layers: only load_config adds the preset.
    cfg = config_module.build_config([("saved", {"d_model": 32})])
    assert (cfg.lr, cfg.steps) == (TrainConfig().lr, TrainConfig().steps)


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
        ("lowercase: 'yes'\n", r"lowercase must be true or false, got str"),
        ("n_layers: 2.0\n", r"n_layers must be an integer, got float"),
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
        ("d_model: 30\n", r"run\.yaml: n_heads must divide d_model 30, got 4"),  # the default heads, blamed here
        ("batch: 0\n", r"run\.yaml: batch must be >= 1, got 0"),
        ("lr: -0.001\n", r"run\.yaml: lr must be a finite number >= 0"),
        ("steps: 0\n", r"steps must be >= 1"),
        ("val_fraction: 1.0\n", r"val_fraction must be a finite number in \[0, 1\), got 1.0"),
        ("time_budget: 0\n", r"time_budget must be a finite number in \(0, 604,800\], got 0"),
        ("time_budget: .nan\n", r"time_budget must be a finite number"),
        ("lr: .inf\n", r"lr must be a finite number >= 0, got inf"),
        ("n_heads: 0\n", r"run\.yaml: n_heads must be >= 1, got 0"),
        ("n_layers: 0\n", r"run\.yaml: n_layers must be 1\.\.12, got 0"),
        ("context: 0\n", r"run\.yaml: context must be 1\.\.256, got 0"),
        ("d_model: 0\n", r"run\.yaml: d_model must be >= 1, got 0"),
        ("d_model: 2000\n", r"run\.yaml: d_model must be <= 1,024, got 2,000"),
        ("val_fraction: -0.1\n", r"val_fraction must be a finite number in \[0, 1\)"),
        ("n_layers: 13\n", r"n_layers must be 1\.\.12, got 13"),
        ("context: 257\n", r"context must be 1\.\.256, got 257"),
        ("lowercase: 1\n", r"lowercase must be true or false"),
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
    with pytest.raises(ConfigError, match=r"absent\.yaml: no such file, and not a shipped config"):
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
