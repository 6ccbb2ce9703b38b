"""The optimiser keys (weight_decay, adam_beta1, adam_beta2, adam_eps, grad_clip) from every door (flags, YAML,
train() keywords, sweeps) to the backend session; refusals before a run directory exists; checkpoints that keep
the settings; and default runs that never call anything new, bit for bit."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from cli_errors import one_line_error
from eemicrogpt_backend_numpy.session import NumpySession
from legacy_checkpoint import read_meta, write_members
from reporters import StopAt
from typer.testing import CliRunner

import eemicrogpt
from eemicrogpt_core.backends.backend import BackendSpec, ProbeResult, TrainState
from eemicrogpt_core.backends.hookspec import hookimpl
from eemicrogpt_core.backends.registry import BackendRegistry, load_registry, open_session
from eemicrogpt_core.base.errors import BackendSelectionError, BatchError, ConfigError
from eemicrogpt_core.interface import cli
from eemicrogpt_core.kit.conformance import load_names, make_batches
from eemicrogpt_core.model.optim import DEFAULT_OPTIMIZER, OptimizerSettings
from eemicrogpt_core.model.shape import ModelShape, init_params
from eemicrogpt_core.training import runs
from eemicrogpt_core.training.checkpoint import load_checkpoint
from eemicrogpt_core.training.config import KEYS, OPTIMIZER_KEYS, TrainConfig, build_config, load_config
from eemicrogpt_core.training.rundir import RunDir
from eemicrogpt_core.training.trainer import train

RECIPE = {"weight_decay": 0.1, "adam_beta1": 0.9, "adam_beta2": 0.95, "adam_eps": 1e-6, "grad_clip": 0.5}
RECIPE_OPT = OptimizerSettings(beta1=0.9, beta2=0.95, eps=1e-6, weight_decay=0.1, grad_clip=0.5)
TINY = ["--backend", "numpy_ref", "--d-model", "16", "--steps", "20", "--log-every", "10", "--eval-batches", "2"]
NO_ENV = {"EEMICROGPT_BACKEND": None, "EEMICROGPT_DATA": None}


def flags(keys: dict[str, float]) -> list[str]:
    return [arg for key, value in keys.items() for arg in (f"--{key.replace('_', '-')}", str(value))]


@pytest.fixture
def given(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[OptimizerSettings]]:
    """Every OptimizerSettings a numpy_ref session is given in this test, in order."""
    seen: list[OptimizerSettings] = []
    original = NumpySession.set_optimizer

    def record(self: NumpySession, opt: OptimizerSettings) -> None:
        seen.append(opt)
        original(self, opt)

    monkeypatch.setattr(NumpySession, "set_optimizer", record)
    yield seen


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli.app, ["train", *args], env=NO_ENV)


# ---- the keys ---------------------------------------------------------------------------------------------------
def test_the_keys_default_to_the_original_adam() -> None:
    assert set(OPTIMIZER_KEYS) <= set(KEYS)
    assert TrainConfig().optimizer() == DEFAULT_OPTIMIZER and TrainConfig().optimizer_changes() == []
    cfg = build_config([("t", RECIPE)])
    assert cfg.optimizer() == RECIPE_OPT
    assert cfg.optimizer_changes() == ["weight_decay 0.1", "adam_beta1 0.9", "adam_beta2 0.95", "adam_eps 1e-06",
                                       "grad_clip 0.5"]


@pytest.mark.parametrize(("keys", "message"), [
    ({"adam_beta1": 1}, "t.yaml: adam_beta1 must be in [0, 1) (as a float32), got 1.0"),
    ({"adam_beta2": -0.1}, "t.yaml: adam_beta2 must be in [0, 1) (as a float32), got -0.1"),
    ({"adam_eps": 0}, "t.yaml: adam_eps must be > 0 and finite (as a float32), got 0.0"),
    ({"weight_decay": -1}, "t.yaml: weight_decay must be >= 0 and finite, below 1e+30 (0 is off), got -1.0"),
    ({"grad_clip": 1e31}, "t.yaml: grad_clip must be >= 0 and finite, below 1e+30 (0 is off), got 1e+31"),
    # judged as float32, as the native backends receive them: these round onto a refused value
    ({"adam_beta1": 0.999999999}, "t.yaml: adam_beta1 must be in [0, 1) (as a float32), got 0.999999999"),
    ({"adam_eps": 1e-46}, "t.yaml: adam_eps must be > 0 and finite (as a float32), got 1e-46"),
    ({"grad_clip": float("inf")}, "t.yaml: grad_clip must be a finite number, got inf"),
    ({"weight_decay": "lots"}, "t.yaml: weight_decay must be a number, got str 'lots'"),
])
def test_bad_values_are_one_line_naming_the_key(keys: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        build_config([("t.yaml", keys)])
    assert str(e.value) == message


@pytest.mark.parametrize(("args", "fragment"), [
    (["--adam-beta2", "1"], "command line: adam_beta2 must be in [0, 1) (as a float32), got 1.0"),
    (["--weight-decay", "-0.5"], "command line: weight_decay must be >= 0"),
    (["--grad-clip", "nan"], "command line: grad_clip must be a finite number, got nan"),
])
def test_the_cli_refuses_bad_values_before_any_run_directory(tmp_path: Path, names_file: Path, args: list[str],
                                                             fragment: str) -> None:
    out = tmp_path / "run"
    result = invoke(*TINY, "--data", str(names_file), "--out", str(out), *args)
    one_line_error(result, fragment)
    assert not out.exists()


def test_the_session_wrapper_checks_the_settings() -> None:
    entry = load_registry().get("numpy_ref")
    assert entry is not None
    with open_session(entry, ModelShape(16), 4) as session:
        assert session.takes_optimizer
        with pytest.raises(BatchError, match=r"optimiser eps must be > 0 and finite \(as a float32\), got -1.0"):
            session.set_optimizer(OptimizerSettings(eps=-1.0))


# ---- every door reaches the session ------------------------------------------------------------------------------
def test_flags_reach_the_session_and_the_summary(tmp_path: Path, names_file: Path,
                                                 given: list[OptimizerSettings]) -> None:
    out = tmp_path / "run"
    result = invoke(*TINY, "--data", str(names_file), "--out", str(out), *flags(RECIPE))
    assert result.exit_code == 0, result.output
    assert given == [RECIPE_OPT, RECIPE_OPT]  # the check before the run directory exists, then the run's session
    assert ("optimiser: weight_decay 0.1, adam_beta1 0.9, adam_beta2 0.95, adam_eps 1e-06, grad_clip 0.5 (the "
            "other optimiser keys at their defaults)") in result.stdout
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert {key: saved[key] for key in RECIPE} == RECIPE
    assert load_checkpoint(out / "checkpoint.npz").config.optimizer() == RECIPE_OPT


def test_yaml_keys_reach_the_session(tmp_path: Path, names_file: Path, given: list[OptimizerSettings]) -> None:
    config = tmp_path / "adamw.yaml"
    config.write_text("weight_decay: 0.1\nadam_beta1: 0.9\nadam_beta2: 0.95\nadam_eps: 1e-6\ngrad_clip: 0.5\n")
    result = invoke(*TINY, "--config", str(config), "--data", str(names_file), "--out", str(tmp_path / "run"),
                    "--grad-clip", "2")  # a flag still wins over the file
    assert result.exit_code == 0, result.output
    assert given[-1] == dataclasses.replace(RECIPE_OPT, grad_clip=2.0)


def test_train_keywords_reach_the_session(tmp_path: Path, names_file: Path, given: list[OptimizerSettings],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EEMICROGPT_BACKEND", raising=False)
    run = eemicrogpt.train(data=names_file, backend="numpy_ref", d_model=16, steps=10, log_every=10, eval_batches=2,
                           out=str(tmp_path / "run"), progress=False, **RECIPE)
    assert given[-1] == RECIPE_OPT and run.config.optimizer() == RECIPE_OPT
    assert eemicrogpt.load(run.run_dir).config.optimizer() == RECIPE_OPT
    refused = r"^train\(\) keys: adam_beta1 must be in \[0, 1\) \(as a float32\), got 1.5$"
    with pytest.raises(ConfigError, match=refused):
        eemicrogpt.train(data=names_file, backend="numpy_ref", d_model=16, steps=10, adam_beta1=1.5,
                         out=str(tmp_path / "bad"), progress=False)
    assert not (tmp_path / "bad").exists()


def test_a_sweep_over_weight_decay(tmp_path: Path, names_file: Path) -> None:
    spec = tmp_path / "wd.yaml"
    base = {"d_model": 16, "backend": "numpy_ref", "eval_batches": 2, "log_every": 20, "chunk_steps": 10,
            "grad_clip": 1.0}
    spec.write_text(yaml.safe_dump({"name": "wd", "base": base, "grid": {"weight_decay": [0.0, 3.0]}, "steps": 20}))
    out = tmp_path / "sweep"
    done = subprocess.run([sys.executable, "-c", "from eemicrogpt_core.interface.cli import app; app()", "sweep",
                           str(spec), "--out", str(out), "--data", str(names_file), "--workers", "1"],
                          capture_output=True, text=True, timeout=600, env=_env_without_backend())
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {r["run_id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert set(rows) == {"weight_decay=0", "weight_decay=3"}
    params = {}
    for rid, row in rows.items():
        assert row["status"] == "done" and row["weight_decay"] == float(rid.split("=")[1])
        ckpt = load_checkpoint(out / "runs" / rid / "checkpoint.npz")
        assert ckpt.config.weight_decay == row["weight_decay"] and ckpt.config.grad_clip == 1.0
        params[rid] = ckpt.state.params
    # Decay pulls the parameters towards zero (measured: a 6% smaller norm after these 20 steps, whose rates sum
    # to about 0.1, against Adam's own steps of up to lr per element).
    ratio = np.linalg.norm(params["weight_decay=3"]) / np.linalg.norm(params["weight_decay=0"])
    assert ratio < 0.99, ratio


def _env_without_backend() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("EEMICROGPT_BACKEND", "EEMICROGPT_DATA")}


# ---- resume ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def recipe_cfg(names_file: Path) -> TrainConfig:
    return dataclasses.replace(TrainConfig(d_model=16, steps=40, lr=0.01, backend="numpy_ref", data=str(names_file),
                                           log_every=20, chunk_steps=10, eval_batches=2), **RECIPE)


def test_an_interrupted_run_resumes_with_its_optimizer_bit_for_bit(registry: BackendRegistry, recipe_cfg: TrainConfig,
                                                                   tmp_path: Path) -> None:
    whole = train(recipe_cfg, registry, run_dir=RunDir.create(str(tmp_path / "whole"), recipe_cfg))
    run = RunDir.create(str(tmp_path / "split"), recipe_cfg)
    first = train(recipe_cfg, registry, run_dir=run, reporter=StopAt(20))
    assert first.interrupted and first.steps_run < 40
    plan = runs.plan_resume(registry, run.path)
    assert isinstance(plan, runs.RunPlan) and plan.cfg.optimizer() == RECIPE_OPT  # from the checkpoint
    second = runs.execute(plan, registry)
    assert np.array_equal(np.concatenate([first.losses, second.losses]), whole.losses)
    assert np.array_equal(second.state.params, whole.state.params)
    plain = train(dataclasses.replace(recipe_cfg, **{key: getattr(TrainConfig, key) for key in RECIPE}), registry)
    assert not np.array_equal(plain.state.params, whole.state.params)  # the settings did change the run


def test_resume_keeps_the_saved_settings_and_refuses_new_ones(tmp_path: Path, names_file: Path,
                                                              given: list[OptimizerSettings]) -> None:
    out = tmp_path / "run"
    assert invoke(*TINY, "--data", str(names_file), "--out", str(out), *flags(RECIPE)).exit_code == 0
    given.clear()
    more = invoke("--resume", str(out), "--steps", "30")
    assert more.exit_code == 0, more.output
    assert given == [RECIPE_OPT, RECIPE_OPT] and "optimiser: weight_decay 0.1" in more.stdout
    one_line_error(invoke("--resume", str(out), "--steps", "40", "--weight-decay", "0.2"),
                   "--resume continues the saved config; drop --weight-decay")


def test_a_checkpoint_from_before_the_optimizer_keys_resumes_with_the_defaults(
        tiny_run_copy: Path, given: list[OptimizerSettings]) -> None:
    path = tiny_run_copy / "checkpoint.npz"
    meta = read_meta(path)
    meta["config"] = {k: v for k, v in meta["config"].items() if k not in OPTIMIZER_KEYS}
    state = load_checkpoint(path).state
    write_members(path, meta, {"params": state.params, "adam_m": state.adam_m, "adam_v": state.adam_v})
    assert load_checkpoint(path).config.optimizer() == DEFAULT_OPTIMIZER
    result = invoke("--resume", str(tiny_run_copy), "--steps", "30")
    assert result.exit_code == 0, result.output
    assert given == [] and "optimiser" not in result.stdout


# ---- backends without set_optimizer ----------------------------------------------------------------------------
class OldSession(NumpySession):
    """A session written before the optimiser settings (None hides the inherited set_optimizer)."""

    set_optimizer = None  # type: ignore[assignment]


class OldPlugin:
    @staticmethod
    @hookimpl
    def eemicrogpt_backends() -> Iterator[BackendSpec]:
        yield BackendSpec("old_py", "a backend without set_optimizer", lambda: ProbeResult.ok(0), OldSession)


def test_a_backend_without_set_optimizer_is_refused_before_the_run_directory(recipe_cfg: TrainConfig,
                                                                             tmp_path: Path) -> None:
    registry = load_registry(extra_plugins=(OldPlugin,))
    cfg = dataclasses.replace(recipe_cfg, backend="old_py", out=str(tmp_path / "run"), weight_decay=0.1,
                              adam_beta1=0.85, adam_beta2=0.99, adam_eps=1e-8, grad_clip=0.0)
    with pytest.raises(BackendSelectionError) as e:
        runs.plan_fresh(registry, cfg)
    assert str(e.value) == ("backend 'old_py' cannot run weight_decay 0.1: its sessions have no set_optimizer, so "
                            "they run only the default optimiser; leave the optimiser keys at their defaults or pick "
                            "another backend")
    assert not (tmp_path / "run").exists()
    with pytest.raises(BackendSelectionError, match=r"cannot run weight_decay 0\.1"):
        train(cfg, registry)  # the trainer refuses it too, when called without a plan
    # The default optimiser runs on it: nothing new is asked of the session.
    default = dataclasses.replace(cfg, weight_decay=0.0, steps=10, log_every=10)
    assert runs.execute(runs.plan_fresh(registry, default), registry).steps_run == 10


# ---- default runs --------------------------------------------------------------------------------------------
def test_default_runs_call_nothing_new_and_equal_explicit_defaults_bit_for_bit(
        registry: BackendRegistry, recipe_cfg: TrainConfig, given: list[OptimizerSettings]) -> None:
    defaults = {key: getattr(TrainConfig, key) for key in RECIPE}
    plain = dataclasses.replace(recipe_cfg, **defaults)
    spelled = build_config([("t", {**plain.to_dict(), "weight_decay": 0, "adam_beta1": 0.85, "adam_beta2": 0.99,
                                   "adam_eps": 1e-8, "grad_clip": 0})])
    assert spelled.optimizer().is_default
    a, b = train(plain, registry), train(spelled, registry)
    assert given == []
    assert np.array_equal(a.losses, b.losses) and np.array_equal(a.state.params, b.state.params)
    # ... and they are the original Adam's: the same steps through a session given the defaults explicitly.
    shape = ModelShape(16)
    entry = registry.get("numpy_ref")
    assert entry is not None
    state = TrainState.fresh(init_params(shape, 3))
    tokens, lengths = make_batches(load_names().names, 5, 8, seed=2)
    lrs = np.full(5, 0.01, np.float32)
    results = []
    for opt in (None, DEFAULT_OPTIMIZER):
        with open_session(entry, shape, 8) as session:
            if opt is not None:
                session.set_optimizer(opt)
            session.set_state(state)
            results.append((session.train_steps(tokens, lengths, lrs), session.get_state().params))
    assert np.array_equal(results[0][0], results[1][0]) and np.array_equal(results[0][1], results[1][1])


def test_the_shipped_recipe_config_uses_adamw() -> None:
    cfg = load_config("names_20s")
    assert cfg.time_budget == 20.0 and cfg.data_format == "lines" and cfg.data is None
    assert cfg.optimizer() == OptimizerSettings(beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1, grad_clip=1.0)
    assert cfg.lr_schedule == "cosine" and 0 < cfg.min_lr < cfg.lr
