"""Sweep specs: expansion (grid x random draws x seeds), stable run names, and one-line errors for bad specs
before anything starts."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from eemicrogpt_core.base.errors import ConfigError
from eemicrogpt_core.interface.cli import app
from eemicrogpt_core.sweep.spec import draw_random, expand, parse_spec

RUNNER = CliRunner()


def spec_of(data: dict) -> object:
    return parse_spec(data, "spec.yaml")


def test_grid_times_seeds_in_order_with_base_and_budget() -> None:
    spec = spec_of({"base": {"d_model": 32, "batch": 8}, "grid": {"d_model": [16, 32], "lr": [0.003, 0.01]},
                    "seeds": [1, 2], "time_budget": 1.5})
    runs = expand(spec)
    assert [r.run_id for r in runs[:3]] == ["d_model=16,lr=0.003,seed=1", "d_model=16,lr=0.003,seed=2",
                                           "d_model=16,lr=0.01,seed=1"]
    assert len(runs) == 8 and len({r.run_id for r in runs}) == 8
    assert {(r.config.d_model, r.config.lr, r.config.seed) for r in runs} == {
        (d, lr, s) for d in (16, 32) for lr in (0.003, 0.01) for s in (1, 2)}
    assert all(r.config.batch == 8 and r.config.time_budget == 1.5 for r in runs)
    assert spec.varied_keys == ["d_model", "lr", "seed"]


def test_steps_shorthand_clears_a_base_time_budget() -> None:
    runs = expand(spec_of({"base": {"time_budget": 2.0}, "grid": {"lr": [0.01]}, "steps": 123}))
    assert runs[0].config.steps == 123 and runs[0].config.time_budget is None


def test_random_draws_are_log_uniform_within_bounds_and_reproducible() -> None:
    data = {"grid": {"d_model": [16, 32]},
            "random": {"count": 200, "seed": 7, "parameters": {
                "lr": {"distribution": "log_uniform", "min": 0.001, "max": 0.1},
                "batch": {"values": [8, 16, 32]}}}}
    draws = draw_random(spec_of(data))
    lrs = [d["lr"] for d in draws]
    assert all(0.001 <= lr <= 0.1 for lr in lrs)
    # Log-uniform: about half the draws below the geometric midpoint 0.01 (a uniform draw would put ~9% there).
    below = sum(lr < 0.01 for lr in lrs) / len(lrs)
    assert 0.35 < below < 0.65
    assert {d["batch"] for d in draws} == {8, 16, 32}
    assert draws == draw_random(spec_of(data))  # same seed, same draws
    data["random"]["seed"] = 8
    assert draws != draw_random(spec_of(data))


def test_random_draws_are_shared_by_every_grid_point() -> None:
    spec = spec_of({"grid": {"d_model": [16, 32]},
                    "random": {"count": 3, "parameters": {"lr": {"distribution": "log_uniform_values",
                                                                 "min": 1e-3, "max": 1e-2}}}})
    runs = expand(spec)
    assert len(runs) == 6
    by_size = {d: [r.config.lr for r in runs if r.config.d_model == d] for d in (16, 32)}
    assert by_size[16] == by_size[32] and len(set(by_size[16])) == 3
    assert all(math.isclose(float(f"{lr:.4g}"), lr) for lr in by_size[16])  # rounded for readable names


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"grid": {"lr": [0.01]}, "sweeps": 3}, "unknown key 'sweeps'"),
        ({"grid": {"lr": []}}, "grid.lr: empty list"),
        ({"grid": {"colour": [1, 2]}}, "'colour' is not a training key"),
        ({"grid": {"lrr": [1, 2]}}, "did you mean 'lr'?"),
        ({"base": {"d_modle": 16}, "grid": {"lr": [0.01]}}, "base: 'd_modle' is not a training key"),
        ({"grid": {"out": ["a", "b"]}}, "'out' cannot be set in a sweep"),
        ({"grid": {"lr": 0.01}}, "expected a list of values"),
        ({"grid": {"lr": [0.01, 0.01]}}, "repeated values"),
        ({"grid": {"seed": [1, 2]}}, "top-level 'seeds'"),
        ({"base": {"d_model": 16}}, "nothing varies"),
        ({"grid": {"lr": [0.01]}, "steps": 10, "time_budget": 1.0}, "not both"),
        ({"seeds": []}, "seeds: expected a non-empty list"),
        ({"seeds": [1, 1]}, "distinct"),
        ({"random": {"parameters": {"lr": {"distribution": "log_uniform", "min": 0, "max": 1}}}}, "min > 0"),
        ({"random": {"parameters": {"lr": {"distribution": "normal", "min": 1, "max": 2}}}}, "log_uniform or uniform"),
        ({"random": {"count": 0, "parameters": {"lr": {"values": [1]}}}}, "random.count: must be a positive"),
        ({"random": {"parameters": {"lr": {"values": []}}}}, "'values' must be a non-empty list"),
        ({"grid": {"lr": [0.01]}, "random": {"parameters": {"lr": {"values": [1]}}}}, "already varied"),
        ({"grid": {"d_model": [16, 30]}}, "n_heads must divide d_model 30"),  # checked per run, up front
        ({"grid": {"lr": [-1.0]}}, "lr must be a finite number >= 0"),
        ({"grid": {"batch": ["many"]}}, "batch must be an integer"),
    ],
)
def test_bad_specs_fail_with_one_line(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        expand(spec_of(data))
    assert message in str(info.value) and "\n" not in str(info.value)
    assert str(info.value).startswith("spec.yaml")


def test_cli_bad_spec_exits_2_in_one_line_and_creates_nothing(tmp_path: Path, names_file: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "bad.yaml"
    spec.write_text(yaml.safe_dump({"grid": {"d_model": [16], "learning_rate": [0.01]}}))
    result = RUNNER.invoke(app, ["sweep", str(spec), "--data", str(names_file)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "'learning_rate' is not a training key" in lines[0], result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]  # no sweep directory, no runs


def test_cli_missing_names_file_and_unknown_backend_fail_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"grid": {"lr": [0.01, 0.02]}}))
    result = RUNNER.invoke(app, ["sweep", str(spec), "--data", str(tmp_path / "nope.txt")])
    assert result.exit_code == 2 and "nope.txt" in result.output and len(result.output.strip().splitlines()) == 1
    result = RUNNER.invoke(app, ["sweep", str(spec), "--data", str(spec), "--backend", "no_such_backend"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "sweeps").exists()


def test_cli_ray_flags_are_checked(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"grid": {"lr": [0.01]}}))
    result = RUNNER.invoke(app, ["sweep", str(spec), "--address", "127.0.0.1:6379"])
    assert result.exit_code == 2 and "--address is for --executor ray" in result.output
    result = RUNNER.invoke(app, ["sweep", str(spec), "--executor", "dask"])
    assert result.exit_code == 2 and "--executor must be one of local, ray" in result.output


def test_a_wandb_sweep_config_is_read() -> None:
    grid = parse_spec({"method": "grid", "name": "wb", "parameters": {
        "d_model": {"values": [16, 32]}, "lr": {"values": [0.003, 0.01]}, "batch": {"value": 8}}}, "wb.yaml")
    runs = expand(grid)
    assert grid.name == "wb" and len(runs) == 4 and all(r.config.batch == 8 for r in runs)
    assert {(r.config.d_model, r.config.lr) for r in runs} == {(16, 0.003), (16, 0.01), (32, 0.003), (32, 0.01)}
    random = parse_spec({"method": "random", "run_cap": 50, "parameters": {
        "lr": {"distribution": "log_uniform", "min": math.log(1e-3), "max": math.log(1e-1)},  # W&B: log bounds
        "d_model": {"values": [16, 32]}}}, "wb.yaml")
    draws = draw_random(random)
    assert len(draws) == 50 and all(1e-3 <= d["lr"] <= 1e-1 for d in draws)
    assert {d["d_model"] for d in draws} == {16, 32}
    with pytest.raises(ConfigError, match="method: must be grid or random"):
        parse_spec({"method": "bayes", "parameters": {}}, "wb.yaml")
    with pytest.raises(ConfigError, match="a grid sweep takes 'values'"):
        parse_spec({"method": "grid", "parameters": {"lr": {"min": 0.1, "max": 1}}}, "wb.yaml")


def test_hydra_comma_lists_in_the_grid() -> None:
    runs = expand(spec_of({"grid": {"d_model": "16,32", "lr": "0.003, 0.01"}}))
    assert [(r.config.d_model, r.config.lr) for r in runs] == [(16, 0.003), (16, 0.01), (32, 0.003), (32, 0.01)]


def test_linked_grid_entries_set_several_keys_together() -> None:
    spec = spec_of({"grid": {"size": [{"d_model": 16, "steps": 400}, {"d_model": 128, "steps": 100}],
                             "lr": [0.003, 0.01]}})
    runs = expand(spec)
    assert [(r.config.d_model, r.config.steps, r.config.lr) for r in runs] == [
        (16, 400, 0.003), (16, 400, 0.01), (128, 100, 0.003), (128, 100, 0.01)]
    assert runs[0].run_id == "d_model=16,steps=400,lr=0.003" and spec.varied_keys == ["d_model", "steps", "lr"]
    for bad, message in [
        ({"size": [{"d_model": 16}, {"d_model": 32, "steps": 9}]}, "every entry must set the same keys"),
        ({"size": [{"d_model": 16, "colour": 1}]}, "'colour' is not a training key"),
        ({"size": [{"d_model": 16}], "d_model": [32]}, "'d_model' is set by two grid keys"),
    ]:
        with pytest.raises(ConfigError, match=message):
            expand(spec_of({"grid": bad}))
