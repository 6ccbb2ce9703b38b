"""What a backend session returns is checked before the trainer uses or saves it; divergence found anywhere
(a chunk, the validation pass, a Ctrl-C save) is one line. Fixture plugins return each kind of bad output."""

from __future__ import annotations

import shutil
import types
from pathlib import Path

import numpy as np
import pytest
from eemicrogpt_backend_numpy.session import NumpySession
from reporters import StopAt
from typer.testing import CliRunner

from eemicrogpt_core.backends.backend import BackendSpec, ProbeResult, TrainState
from eemicrogpt_core.backends.hookspec import hookimpl
from eemicrogpt_core.backends.registry import BackendRegistry, load_registry
from eemicrogpt_core.backends.session_checks import checked_loss, checked_losses, checked_state
from eemicrogpt_core.base.errors import BackendOutputError, NonFiniteError
from eemicrogpt_core.interface import cli
from eemicrogpt_core.training.checkpoint import load_checkpoint
from eemicrogpt_core.training.config import TrainConfig
from eemicrogpt_core.training.rundir import RunDir
from eemicrogpt_core.training.trainer import lower_lr, train

RUNNER = CliRunner()


class ShortState(NumpySession):
    def get_state(self) -> TrainState:
        state = super().get_state()
        return TrainState(state.params[:-3], state.adam_m, state.adam_v, state.step)


class ExtraLosses(NumpySession):
    def train_steps(self, tokens, lengths, lrs):
        losses = super().train_steps(tokens, lengths, lrs)
        return np.concatenate([losses, np.full(len(losses), 0.5, np.float32)])  # pulls the reported mean down


class TwoDLosses(NumpySession):
    def train_steps(self, tokens, lengths, lrs):
        return super().train_steps(tokens, lengths, lrs)[:, None]


class ListLosses(NumpySession):
    def train_steps(self, tokens, lengths, lrs):
        return super().train_steps(tokens, lengths, lrs).tolist()


class FloatStep(NumpySession):
    def get_state(self) -> TrainState:
        state = super().get_state()
        return TrainState(state.params, state.adam_m, state.adam_v, float(state.step) + 0.5)


class StringLoss(NumpySession):
    def loss_and_grads(self, tokens, lengths, want_grads=True):
        return "low", None


class EvalRaises(NumpySession):
    """Diverges only in the validation pass, as a native backend does after an update to huge parameters."""

    error = NonFiniteError("emg_loss_and_grad failed: non-finite loss or parameter (status 4)")

    def loss_and_grads(self, tokens, lengths, want_grads=True):
        raise self.error


SESSIONS = {"short_state": ShortState, "extra_losses": ExtraLosses, "two_d_losses": TwoDLosses,
            "list_losses": ListLosses, "float_step": FloatStep, "string_loss": StringLoss,
            "eval_raises": EvalRaises}


def fixture_plugin() -> types.ModuleType:
    module = types.ModuleType("bad_outputs")
    specs = [BackendSpec(name, f"returns bad output ({name})", lambda: ProbeResult.ok(0),
                         lambda s, b, d, cls=cls: cls(s, b, d)) for name, cls in SESSIONS.items()]
    module.eemicrogpt_backends = hookimpl(lambda: specs)
    return module


@pytest.fixture
def bad_registry(monkeypatch: pytest.MonkeyPatch) -> BackendRegistry:
    registry = load_registry(extra_plugins=(fixture_plugin(),))
    monkeypatch.setattr(cli, "load_registry", lambda: registry)
    return registry


def run(*args: str):
    return RUNNER.invoke(cli.app, list(args), env={"EEMICROGPT_BACKEND": None})


def one_line(result, *fragments: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("eemicrogpt: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def saved_run(names_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A numpy_ref d16 run of 300 steps stopped (and saved) at step 100."""
    cfg = TrainConfig(d_model=16, steps=300, lr=0.01, backend="numpy_ref", data=str(names_file), log_every=100,
                      eval_batches=2, out=str(tmp_path_factory.mktemp("saved") / "run"))
    run_dir = RunDir.create(cfg.out, cfg)
    train(cfg, load_registry(), run_dir=run_dir, reporter=StopAt(100))
    return run_dir.path


@pytest.mark.parametrize(("backend", "fragments"), [
    ("short_state", ["backend 'short_state' returned a bad state from get_state", "params is an array of shape "
                     "(4189,) float32, expected (4192,) float32"]),
    ("float_step", ["backend 'float_step' returned a bad state", "step is float 100.5, not an integer"]),
])
def test_a_bad_state_never_replaces_the_good_checkpoint(backend: str, fragments: list[str], saved_run: Path,
                                                        bad_registry: BackendRegistry, names_file: Path,
                                                        tmp_path: Path) -> None:
    run_dir = Path(shutil.copytree(saved_run, tmp_path / "run"))
    before = (run_dir / "checkpoint.npz").read_bytes()
    result = run("train", "--resume", str(run_dir), "--backend", backend, "--data", str(names_file))
    one_line(result, *fragments)
    assert (run_dir / "checkpoint.npz").read_bytes() == before
    resumed = run("train", "--resume", str(run_dir), "--backend", "numpy_ref", "--data", str(names_file))
    assert resumed.exit_code == 0, resumed.output  # the run goes on from the good checkpoint
    assert load_checkpoint(run_dir / "checkpoint.npz").state.step == 300


@pytest.mark.parametrize(("backend", "got"), [
    ("extra_losses", "an array of shape (16,) float32"),
    ("two_d_losses", "an array of shape (8, 1) float32"),
    ("list_losses", "list"),
])
def test_losses_of_the_wrong_count_or_shape_are_one_line(backend: str, got: str, bad_registry: BackendRegistry,
                                                         names_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run("train", "--backend", backend, "--data", str(names_file), "--d-model", "16", "--steps", "50",
                 "--log-every", "25", "--out", str(out))
    # The first chunk is 8 steps (it grows once the step time is known).
    one_line(result, f"backend '{backend}' returned {got} from train_steps for 8 steps", "expected a float array of "
             "8 losses", "nothing was saved")
    assert not (out / "checkpoint.npz").exists()


def test_a_loss_that_is_not_a_number_is_one_line(bad_registry: BackendRegistry, names_file: Path,
                                                 tmp_path: Path) -> None:
    result = run("train", "--backend", "string_loss", "--data", str(names_file), "--d-model", "16", "--steps", "20",
                 "--log-every", "10", "--out", str(tmp_path / "run"))
    one_line(result, "backend 'string_loss' returned a loss of str from loss_and_grads; expected a number")
    assert not (tmp_path / "run" / "checkpoint.npz").exists()


@pytest.mark.parametrize("backend", ["eval_raises"])
def test_divergence_in_the_validation_pass_is_one_line(backend: str, bad_registry: BackendRegistry,
                                                       names_file: Path, tmp_path: Path) -> None:
    result = run("train", "--backend", backend, "--data", str(names_file), "--d-model", "16", "--steps", "20",
                 "--log-every", "1", "--lr", "0.004", "--out", str(tmp_path / "run"))
    one_line(result, "training diverged: the validation loss at step 1 is not finite", "status 4",
             "try a lower --lr (now 0.004, e.g. 0.0004)")
    assert not (tmp_path / "run" / "checkpoint.npz").exists()


def test_lr_1e30_with_a_log_every_step_is_one_line(names_file: Path, tmp_path: Path) -> None:
    """numpy_ref: the update of step 1 leaves huge but finite parameters; the validation pass overflows."""
    result = run("train", "--backend", "numpy_ref", "--data", str(names_file), "--d-model", "16", "--lr", "1e30",
                 "--log-every", "1", "--out", str(tmp_path / "run"))
    one_line(result, "training diverged", "at step 1", "e.g. 0.01")
    assert "Warning" not in result.stderr and not (tmp_path / "run" / "checkpoint.npz").exists()


def test_the_suggested_lr_is_one_that_trains() -> None:
    assert lower_lr(1e30, 16) == 0.01  # the d16 preset's rate, not 1e29
    assert lower_lr(1.0, 64) == TrainConfig.lr
    assert lower_lr(0.05, 16) == pytest.approx(0.005)  # near the usual rate: a tenth
    assert lower_lr(0.01, 16) == pytest.approx(0.001)


# ---- the checks themselves ----------------------------------------------------------------------------------
def test_state_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    n, f32 = 8, np.dtype(np.float32)
    good = TrainState(np.zeros(n, f32), np.zeros(n, f32), np.ones(n, f32), 5)
    got = checked_state("b", good, n, f32, 5)
    assert got.step == 5 and got.params is not good.params  # a copy: later training cannot alter it
    cases = [
        (TrainState(good.params, good.adam_m, -good.adam_v, 5), "adam_v holds negative values"),
        (TrainState(good.params, good.adam_m, good.adam_v, 6), "step 6, but 5 steps were taken"),
        (TrainState(good.params, good.adam_m, good.adam_v, True), "step is bool True, not an integer"),
        (TrainState(good.params.astype(np.float64), good.adam_m, good.adam_v, 5), "params is an array of shape (8,) "
         "float64, expected (8,) float32"),
        (TrainState(good.params[None], good.adam_m, good.adam_v, 5), "shape (1, 8)"),
        ((good.params, good.adam_m, good.adam_v, 5), "tuple, not a TrainState"),
    ]
    for state, message in cases:
        with pytest.raises(BackendOutputError, match=message.replace("(", r"\(").replace(")", r"\)")):
            checked_state("b", state, n, f32, 5)
    nan_state = TrainState(np.full(n, np.nan, f32), good.adam_m, np.full(n, np.nan, f32), 5)
    assert np.isnan(checked_state("b", nan_state, n, f32, None).params).all()  # divergence is the trainer's call


def test_loss_checks() -> None:
    assert checked_losses("b", np.array([1.0, np.nan]), 2).dtype == np.float32  # NaN: the trainer locates it
    for raw in (np.array([1, 2]), np.array(["1", "2"]), np.zeros(3, np.float32), (1.0, 2.0)):
        with pytest.raises(BackendOutputError, match="from train_steps for 2 steps"):
            checked_losses("b", raw, 2)
    assert checked_loss("b", (np.float32(2.5), None), 4, False) == (2.5, None)
    assert checked_loss("b", (np.array(2.5), None), 4, False)[0] == 2.5
    with pytest.raises(BackendOutputError, match="a gradient of NoneType; expected 4 floats"):
        checked_loss("b", (2.5, None), 4, True)
    with pytest.raises(BackendOutputError, match="expected a \\(loss, gradient\\) pair"):
        checked_loss("b", 2.5, 4, False)
    with pytest.raises(BackendOutputError, match="a loss of bool"):
        checked_loss("b", (True, None), 4, False)


class NanState(NumpySession):
    def get_state(self) -> TrainState:
        state = super().get_state()
        return TrainState(np.full_like(state.params, np.nan), state.adam_m, state.adam_v, state.step)


def test_a_stop_never_saves_a_non_finite_state(saved_run: Path, names_file: Path, tmp_path: Path) -> None:
    """Ctrl-C between chunks saves the state of that moment: not when it holds NaN (no log step checked it)."""
    from eemicrogpt_core.training.trainer import TrainingDiverged

    module = types.ModuleType("nan_state")
    module.eemicrogpt_backends = hookimpl(lambda: [BackendSpec("nan_state", "d", lambda: ProbeResult.ok(0),
                                                               NanState)])
    run_dir = RunDir(Path(shutil.copytree(saved_run, tmp_path / "run")))
    before = run_dir.checkpoint_path.read_bytes()
    ckpt = load_checkpoint(run_dir.checkpoint_path)
    cfg = TrainConfig(**{**ckpt.config.to_dict(), "backend": "nan_state", "data": str(names_file)})
    with pytest.raises(TrainingDiverged, match="the params became non-finite by step 108; the last good "
                                               "checkpoint \\(step 100\\) is kept"):
        train(cfg, load_registry(extra_plugins=(module,)), run_dir=run_dir, resume=ckpt, reporter=StopAt(101))
    assert run_dir.checkpoint_path.read_bytes() == before
