"""The training loop on numpy_ref: falling loss, exact resume, chunking invariance, time budgets, Ctrl-C."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from reporters import Messages, StopAt

from eemicrogpt_core.backends.backend import BackendSpec, ProbeResult, TrainState
from eemicrogpt_core.backends.hookspec import hookimpl
from eemicrogpt_core.backends.registry import BackendRegistry, load_registry
from eemicrogpt_core.base.errors import BackendSelectionError, ConfigError, DataError
from eemicrogpt_core.data.names import read_names
from eemicrogpt_core.model.optim import LrSchedule
from eemicrogpt_core.model.vocab import Vocabulary
from eemicrogpt_core.training.checkpoint import load_checkpoint
from eemicrogpt_core.training.config import TrainConfig, build_config
from eemicrogpt_core.training.rundir import RunDir
from eemicrogpt_core.training.trainer import NullReporter, TrainingDiverged, prepare_data, train

UNIFORM_LOSS = float(np.log(27))  # 3.296


@pytest.fixture(scope="module")
def cfg(names_file: Path) -> TrainConfig:
    return TrainConfig(d_model=16, steps=60, lr=0.01, backend="numpy_ref", data=str(names_file),
                       log_every=30, chunk_steps=25, eval_batches=4)



class SigintAt(NullReporter):
    """Sends this process a real SIGINT from `step` on: the loop must finish the chunk, save and stop."""

    def __init__(self, step: int) -> None:
        self.step, self.messages, self.sent_at = step, [], None

    def progress(self, step: int, total: int, train_loss: float) -> None:
        if step >= self.step and self.sent_at is None:
            self.sent_at = step
            os.kill(os.getpid(), signal.SIGINT)

    def message(self, text: str) -> None:
        self.messages.append(text)


def test_short_run_learns_and_writes_a_run_dir(registry: BackendRegistry, cfg: TrainConfig, tmp_path: Path) -> None:
    run = RunDir.create(str(tmp_path / "run"), cfg)
    result = train(dataclasses.replace(cfg, steps=200, log_every=100), registry, run_dir=run)
    assert result.backend == "numpy_ref" and result.steps_run == 200 and not result.interrupted
    assert result.losses[:10].mean() > 3.0
    assert result.train_loss < UNIFORM_LOSS - 0.6 and result.val_loss is not None
    assert result.val_loss < UNIFORM_LOSS - 0.6
    records = run.read_metrics()
    assert [r["step"] for r in records] == [100, 200]
    assert records[-1]["lr"] == pytest.approx(LrSchedule(0.01).at(200, 200), abs=1e-9)
    assert run.config_path.is_file() and run.checkpoint_path.is_file()
    assert load_checkpoint(run.checkpoint_path).state.step == 200


@pytest.mark.parametrize("backend", ["numpy_ref", "avx512", "avx2"])
def test_resume_continues_exactly(registry: BackendRegistry, cfg: TrainConfig, tmp_path: Path, backend: str) -> None:
    entry = registry.get(backend)
    if entry is None or not entry.available:
        pytest.skip(f"{backend} not available here: {entry.status_reason if entry else 'not installed'}")
    cfg = dataclasses.replace(cfg, backend=backend)
    whole = train(cfg, registry, run_dir=RunDir.create(str(tmp_path / "whole"), cfg))

    run = RunDir.create(str(tmp_path / "split"), cfg)
    first = train(cfg, registry, run_dir=run, reporter=StopAt(25))
    assert first.interrupted and 25 <= first.steps_run < 60  # stops at the first chunk boundary from step 25
    ckpt = load_checkpoint(run.checkpoint_path)
    assert ckpt.state.step == first.steps_run and ckpt.total_steps == 60
    second = train(ckpt.config, registry, run_dir=RunDir.existing(run.path), resume=ckpt)

    assert np.array_equal(np.concatenate([first.losses, second.losses]), whole.losses)
    assert np.array_equal(second.state.params, whole.state.params)
    assert np.array_equal(second.state.adam_v, whole.state.adam_v)
    assert second.train_loss == whole.train_loss and second.val_loss == whole.val_loss
    assert [r["step"] for r in run.read_metrics()] == [30, 60]


def test_losses_do_not_depend_on_chunk_size(registry: BackendRegistry, cfg: TrainConfig) -> None:
    a = train(dataclasses.replace(cfg, steps=30, chunk_steps=30), registry)
    b = train(dataclasses.replace(cfg, steps=30, chunk_steps=7), registry)
    assert np.array_equal(a.losses, b.losses)


def test_sample_every_prints_samples_at_its_log_lines_and_changes_no_bit(registry: BackendRegistry,
                                                                          cfg: TrainConfig) -> None:
    plain = train(cfg, registry)
    seen = Messages()
    sampled = train(dataclasses.replace(cfg, sample_every=60), registry, reporter=seen)
    np.testing.assert_array_equal(sampled.losses, plain.losses)  # drawing samples takes nothing from training
    np.testing.assert_array_equal(sampled.state.params, plain.state.params)
    (line,) = seen.messages  # log lines at 30 and 60: a sample at 60 only
    assert line.startswith("step 60 samples: ") and len(line.split(": ", 1)[1].split(", ")) == 10, line


def test_sample_every_must_be_a_multiple_of_log_every(cfg: TrainConfig) -> None:
    with pytest.raises(ConfigError, match=r"sample_every must be a multiple of log_every \(30\)"):
        build_config([("command line", {"sample_every": 45})], cfg)


def test_real_sigint_stops_at_a_chunk_boundary_and_saves(
    registry: BackendRegistry, cfg: TrainConfig, tmp_path: Path
) -> None:
    run = RunDir.create(str(tmp_path / "run"), cfg)
    reporter = SigintAt(25)
    result = train(cfg, registry, run_dir=run, reporter=reporter)
    assert result.interrupted and result.steps_run == reporter.sent_at  # stopped right after that chunk
    assert load_checkpoint(run.checkpoint_path).state.step == reporter.sent_at
    assert any("checkpoint saved" in m for m in reporter.messages)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored


def test_time_budget_sets_the_schedule(registry: BackendRegistry, cfg: TrainConfig) -> None:
    budgeted = dataclasses.replace(cfg, steps=1, time_budget=0.3, log_every=10**6)
    result = train(budgeted, registry)
    assert result.total_steps > 10 and result.steps_run == result.total_steps
    assert result.records[-1]["lr"] == pytest.approx(LrSchedule(cfg.lr).at(result.total_steps, result.total_steps))


def test_explicit_unavailable_backend_never_falls_back(registry: BackendRegistry, cfg: TrainConfig) -> None:
    with pytest.raises(BackendSelectionError, match="unknown backend 'avx9000'"):
        train(dataclasses.replace(cfg, backend="avx9000"), registry)


class _NanSession:
    def __init__(self, shape: Any) -> None:
        self.state = TrainState.fresh(np.zeros(shape.n_params, np.float32))

    def set_state(self, state: TrainState) -> None:
        self.state = state.copy()

    def get_state(self) -> TrainState:
        return self.state.copy()

    def train_steps(self, tokens: np.ndarray, lengths: np.ndarray, lrs: np.ndarray) -> np.ndarray:
        steps = np.arange(self.state.step + 1, self.state.step + 1 + len(lrs))
        self.state.step += len(lrs)
        return np.where(steps >= 13, np.float32(np.nan), np.float32(2.0)).astype(np.float32)

    def loss_and_grads(self, tokens: np.ndarray, lengths: np.ndarray, want_grads: bool = True) -> Any:
        return 2.0, None

    def close(self) -> None:
        pass


class _NanPlugin:
    @hookimpl
    def eemicrogpt_backends(self) -> list[BackendSpec]:
        return [BackendSpec("nan_backend", "returns NaN losses", lambda: ProbeResult.ok(1),
                            lambda shape, batch, dtype: _NanSession(shape))]


def test_non_finite_loss_is_a_clear_error(cfg: TrainConfig) -> None:
    reg = load_registry(entry_points=False, extra_plugins=[_NanPlugin()])
    expected = "became nan at step 13; no run directory, nothing saved; try a lower --lr"
    with pytest.raises(TrainingDiverged, match=expected):
        train(dataclasses.replace(cfg, backend="nan_backend"), reg)


class _NanParamsSession(_NanSession):
    """Finite losses, but the parameters turn to NaN: such a state must never be saved."""

    def train_steps(self, tokens: np.ndarray, lengths: np.ndarray, lrs: np.ndarray) -> np.ndarray:
        self.state.params[:] = np.nan
        self.state.step += len(lrs)
        return np.full(len(lrs), 2.0, np.float32)


class _NanParamsPlugin:
    @hookimpl
    def eemicrogpt_backends(self) -> list[BackendSpec]:
        return [BackendSpec("nan_params", "NaN parameters, finite losses", lambda: ProbeResult.ok(1),
                            lambda shape, batch, dtype: _NanParamsSession(shape))]


def test_non_finite_parameters_are_never_saved(cfg: TrainConfig, tmp_path: Path) -> None:
    reg = load_registry(entry_points=False, extra_plugins=[_NanParamsPlugin()])
    cfg = dataclasses.replace(cfg, backend="nan_params")
    run_dir = RunDir.create(str(tmp_path / "run"), cfg)
    with pytest.raises(TrainingDiverged, match="parameters became non-finite by step 30; nothing was saved"):
        train(cfg, reg, run_dir=run_dir)
    assert not run_dir.checkpoint_path.exists()


def test_prepare_data_counts(cfg: TrainConfig) -> None:
    data = prepare_data(cfg)
    assert data.val is not None and data.note == ""
    assert len(data.train) + len(data.val) == 32033
    assert len(data.val) == int(np.ceil(0.1 * 32033))
    assert data.vocab == Vocabulary.names() and data.train.tokens.shape[1] == 17
    # context 16 holds the file's longest names (15 letters) whole; context 15 truncates exactly those
    assert data.n_truncated == 0 and data.n_dropped == 0
    longest = sum(len(n) == 15 for n in read_names(cfg.data).names)
    assert longest > 0 and prepare_data(dataclasses.replace(cfg, context=15)).n_truncated == longest


def test_prepare_data_with_a_checkpoints_vocabulary(cfg: TrainConfig, tmp_path: Path) -> None:
    path = tmp_path / "names.txt"
    path.write_text("anna\nbob\nzoë\n", encoding="utf-8")
    own = dataclasses.replace(cfg, data=str(path))
    assert prepare_data(own).vocab.symbols == ("a", "b", "n", "o", "z", "ë")
    with pytest.raises(DataError, match=r"names\.txt:3: character 'ë' \(ë\) is not in the checkpoint's vocabulary"):
        prepare_data(own, Vocabulary.names())
    kept = prepare_data(dataclasses.replace(own, drop_invalid=True), Vocabulary.names())
    assert kept.vocab == Vocabulary.names() and len(kept.train) == 2 and kept.n_dropped == 1


def test_lowercase_folds_before_the_vocabulary_is_built(cfg: TrainConfig, tmp_path: Path) -> None:
    path = tmp_path / "names.txt"
    path.write_text("Emma\nEMMA\nStraße\n", encoding="utf-8")
    kept = prepare_data(dataclasses.replace(cfg, data=str(path)))
    folded = prepare_data(dataclasses.replace(cfg, data=str(path), lowercase=True))
    assert kept.vocab.symbols == ("A", "E", "M", "S", "a", "e", "m", "r", "t", "ß")
    assert folded.vocab.symbols == ("a", "e", "m", "r", "s", "t", "ß")


def test_no_validation_split_trains_and_says_so(registry: BackendRegistry, cfg: TrainConfig, tmp_path: Path) -> None:
    no_val = dataclasses.replace(cfg, val_fraction=0.0)
    data = prepare_data(no_val)
    assert data.val is None and len(data.train) == 32033 and "no validation" in data.note
    run = RunDir.create(str(tmp_path / "run"), no_val)
    result = train(no_val, registry, run_dir=run, reporter=Recorder())
    assert result.val_loss is None and result.steps_run == 60 and np.isfinite(result.train_loss)
    assert [r["val_loss"] for r in run.read_metrics()] == [None, None]
    assert Recorder.last.data_note == data.note
    assert load_checkpoint(run.checkpoint_path).state.step == 60


class Recorder(NullReporter):
    """Keeps the RunInfo the trainer starts with."""

    last: Any = None

    def start(self, info: Any) -> None:
        Recorder.last = info


@pytest.mark.parametrize("lines", [["zoë"], ["zoë", "Ana Lu"]])
def test_one_or_two_names_train(registry: BackendRegistry, cfg: TrainConfig, tmp_path: Path,
                                lines: list[str]) -> None:
    path = tmp_path / "names.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tiny = dataclasses.replace(cfg, data=str(path), steps=30, log_every=30)
    result = train(tiny, registry, reporter=Recorder())
    info = Recorder.last
    assert info.n_train == len(lines), "every name of a tiny file is trained on"
    assert result.val_loss is not None and np.isfinite(result.val_loss)
    assert "too few" in info.data_note and "training names" in info.data_note
    assert result.losses[-5:].mean() < result.losses[:5].mean()  # it learns its few names


class _SlowWithTwoThreads:
    """numpy_ref behind set_threads, as a thread-independent backend on a machine where another process
    holds one of two cores: at 2 threads every call takes an extra 2 ms per step."""

    def __init__(self, inner: Any, counts: list[int]) -> None:
        self.inner, self.counts, self.threads = inner, counts, 2

    def set_threads(self, n: int) -> int:
        self.counts.append(n)
        self.threads = n
        return n

    def train_steps(self, tokens: np.ndarray, lengths: np.ndarray, lrs: np.ndarray) -> np.ndarray:
        if self.threads == 2:
            time.sleep(0.002 * len(lrs))
        return self.inner.train_steps(tokens, lengths, lrs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_threads_auto_picks_the_faster_count_and_trains_the_same_bits(
    registry: BackendRegistry, cfg: TrainConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("eemicrogpt_core.backends.threads.physical_core_count", lambda *_: 2)
    reference = registry.get("numpy_ref")
    assert reference is not None and reference.spec is not None
    counts: list[int] = []

    class Plugin:
        @hookimpl
        def eemicrogpt_backends(self) -> list[BackendSpec]:
            factory = reference.spec.factory
            return [BackendSpec("contended", "numpy_ref, slow on 2 threads", lambda: ProbeResult.ok(1),
                                lambda shape, batch, dtype: _SlowWithTwoThreads(factory(shape, batch, dtype), counts),
                                thread_independent=True)]

    reg = load_registry(entry_points=True, extra_plugins=[Plugin()])
    run_cfg = dataclasses.replace(cfg, backend="contended", steps=400, log_every=400, chunk_steps=50)
    reporter = SigintAt(10**9)  # only records the messages
    auto = train(run_cfg, reg, reporter=reporter)
    picked = [m for m in reporter.messages if m.startswith("threads: auto picked")]
    assert len(picked) == 1 and picked[0].startswith("threads: auto picked 1 ("), reporter.messages
    assert counts[:3] == [2, 2, 1]  # opened at the cores, the 2-thread round, then the 1-thread round
    fixed = train(dataclasses.replace(run_cfg, threads=1), reg)
    np.testing.assert_array_equal(auto.losses, fixed.losses)
