"""A run's life, written once: resolve, check, create or resume, claim, train, release.

`eemicrogpt train`, the Python API's `train()` and every sweep run go through these functions, so they refuse
the same inputs with the same one-line error, in the same order, and none of them creates a run directory
before everything that can be checked without one has been checked:

1. resolve the backend (the caller's choice > $EEMICROGPT_BACKEND > the config) and the data file (the
   caller's choice > $EEMICROGPT_DATA > the config > the cached makemore names);
2. check the memory estimate, the backend against the model's shape (before the download when the default
   names apply, since their vocabulary is known), the data file, then the backend against the data's own
   vocabulary; on resume also the data file's fingerprint against the checkpoint's;
3. create the run directory (fresh) or take the existing one (resume); `execute` claims it for this
   process, trains and releases it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from ..backends.registry import BackendRegistry
from ..base.errors import CheckpointError, ConfigError
from ..base.paths import user_path
from ..data.datafile import given_data_path, resolve_data_path
from ..model.shape import NAMES_VOCAB
from ..model.vocab import Vocabulary
from .checkpoint import Checkpoint, load_checkpoint
from .config import TrainConfig, build_config, resolve_backend
from .limits import check_memory
from .rundir import RunDir
from .trainer import PreparedData, Reporter, TrainResult, prepare_data, train

Note = Callable[[str], None]  # where a run's notes go (the CLI's console, a reporter, or nowhere)
Prepare = Callable[[TrainConfig, "Vocabulary | None"], PreparedData]  # prepare_data, or a caching variant


def _no_note(text: str) -> None:
    pass


@dataclass
class RunPlan:
    """A run checked and ready to train: its final config, its directory (created or existing, not yet
    claimed), its data, and for a resume the checkpoint it continues from."""

    cfg: TrainConfig
    run_dir: RunDir
    data: PreparedData
    resume: Checkpoint | None = None
    extend_to: int | None = None  # a finished (or any) run trained on to this many steps


@dataclass
class AlreadyFinished:
    """A resume of a run that has done all its steps: nothing to train."""

    run_dir: RunDir
    checkpoint: Checkpoint

    def describe(self) -> str:
        ckpt = self.checkpoint
        reached = ckpt.target_reached
        how = (f"stopped at step {int(ckpt.state.step):,} on reaching target_loss {ckpt.config.target_loss:g}"
               if reached is not None and ckpt.state.step == reached.stop else f"{ckpt.total_steps:,} steps")
        return (f"{self.run_dir.path} already finished ({how}); nothing to resume (pass --steps N to train on to "
                "N steps)")


def plan_fresh(registry: BackendRegistry, cfg: TrainConfig, *, backend: str | None = None, data: str | None = None,
               prepare: Prepare = prepare_data) -> RunPlan:
    """A new run of `cfg` (already built from its sources); backend and data are the caller's explicit choices
    (a flag, an argument, a sweep's resolved value), which outrank the environment and the config."""
    check_memory(cfg)
    cfg = dataclasses.replace(cfg, backend=resolve_backend(backend, cfg.backend))
    given = given_data_path(data, cfg.data, data_format=cfg.data_format)
    if given is None and cfg.data_format == "lines":  # the makemore names: their vocabulary is known before the
        registry.select(cfg.backend, cfg.model_shape(NAMES_VOCAB), cfg.batch, cfg.dtype, cfg.precision)  # download
    cfg = dataclasses.replace(cfg, data=str(given or resolve_data_path(None, None, data_format=cfg.data_format)))
    prepared = prepare(cfg, None)
    # The data decides the vocabulary, and with it the shape a backend must run.
    registry.select(cfg.backend, cfg.model_shape(prepared.vocab.size), cfg.batch, cfg.dtype, cfg.precision)
    run = RunDir.create(cfg.out, cfg)
    return RunPlan(dataclasses.replace(cfg, out=str(run.path)), run, prepared)


def check_same_data(ckpt: Checkpoint, prepared: PreparedData, cfg: TrainConfig, allow_change: bool,
                    note: Note) -> None:
    """A resume on other data than the run trained on is refused unless asked for: the batches would differ."""
    if not ckpt.data_sha256:
        note("note: this checkpoint predates data-file fingerprints; the data file is not checked")
    elif ckpt.data_sha256 != prepared.data_sha256:
        if not allow_change:
            raise CheckpointError(
                f"data file {cfg.data} is not the one this run trained on (sha256 {prepared.data_sha256[:12]}..., "
                f"saved {ckpt.data_sha256[:12]}...); pass --data with the original file, or --allow-data-change "
                "to continue on this one"
            )
        note(f"note: continuing on a different data file ({cfg.data}); the batches differ from the original run's")


def plan_resume(
    registry: BackendRegistry, path: str | Path, *, backend: str | None = None, data: str | None = None,
    allow_data_change: bool = False, extend_to: int | None = None, changes: dict[str, Any] | None = None,
    changes_source: str = "command line", note: Note = _no_note, prepare: Prepare = prepare_data,
) -> RunPlan | AlreadyFinished:
    """Continue the run in `path` with its saved config; only backend, data and the settings marked
    `on_resume` (`changes`, checked like any override and named by `changes_source` in errors) may differ.
    extend_to: train on to that many steps (the linear schedule re-spanned), also a finished run."""
    run = RunDir.existing(path)
    ckpt = load_checkpoint(run.checkpoint_path)
    data_path = user_path(data, "--data") if data else ckpt.config.data
    cfg = dataclasses.replace(
        ckpt.config, backend=resolve_backend(backend, ckpt.config.backend), data=str(data_path) if data_path else None,
        out=str(run.path),
    )
    if extend_to is not None:
        if extend_to <= ckpt.state.step:
            raise ConfigError(f"--steps {extend_to:,} with --resume must be more than the {int(ckpt.state.step):,} "
                              "steps this run has done")
        cfg = dataclasses.replace(cfg, steps=extend_to)
        note(f"extending to {extend_to:,} steps (from {ckpt.total_steps:,}): the learning rate decays linearly to 0 "
             f"over all {extend_to:,}, so step {int(ckpt.state.step) + 1:,} continues at "
             f"{ckpt.config.lr * (1 - ckpt.state.step / extend_to):.3g}")
    elif ckpt.finished:
        return AlreadyFinished(run, ckpt)
    if changes:
        cfg = build_config([(changes_source, changes)], cfg)
    check_memory(cfg)
    chosen = registry.select(cfg.backend, ckpt.shape, cfg.batch, cfg.dtype, cfg.precision).name
    prepared = prepare(cfg, ckpt.vocab)
    check_same_data(ckpt, prepared, cfg, allow_data_change, note)
    if ckpt.backend and chosen != ckpt.backend:
        note(f"note: this run was trained on {ckpt.backend} and continues on {chosen}; the losses will not match an "
             f"uninterrupted {ckpt.backend} run bit for bit")
    saved_core = ckpt.versions.get("eemicrogpt")
    if saved_core and saved_core != __version__:
        note(f"note: this run was saved by eemicrogpt {saved_core}; this is {__version__}")
    return RunPlan(cfg, run, prepared, ckpt, extend_to)


def execute(plan: RunPlan, registry: BackendRegistry, reporter: Reporter | None = None) -> TrainResult:
    """Claim the run directory (a second process training it stops here), train, release it."""
    plan.run_dir.claim()
    try:
        return train(plan.cfg, registry, run_dir=plan.run_dir, resume=plan.resume, reporter=reporter,
                     data=plan.data, extend_to=plan.extend_to)
    finally:
        plan.run_dir.release()
