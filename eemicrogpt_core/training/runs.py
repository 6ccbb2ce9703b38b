"""A run's life, written once: resolve, check, create or resume, claim, train, release.

`eemicrogpt train`, the Python API's `train()` and every sweep run go through these functions, so they refuse
the same inputs with the same one-line error, in the same order, and none of them creates a run directory
before everything that can be checked without one has been checked:

1. resolve the backend (the caller's choice > $EEMICROGPT_BACKEND > the config) and the data file (the
   caller's choice > $EEMICROGPT_DATA > the config > the cached makemore names);
2. check the memory estimate, the backend against the model's shape (before the download when the default
   names apply, since their vocabulary is known), the data file, then the backend against the data's own
   vocabulary and, for an optimiser other than the default, whether the backend's sessions take it; on resume
   also the data file's fingerprint against the checkpoint's;
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
from ..model.sampling import generate
from ..model.shape import NAMES_VOCAB
from ..model.vocab import Vocabulary
from .checkpoint import Checkpoint, load_checkpoint
from .config import TrainConfig, build_config, resolve_backend
from .limits import LEAST_ROWS, check_memory
from .rundir import RunDir
from .sinks import SinkReporter, check_installed, open_sinks
from .trainer import NullReporter, PreparedData, Reporter, TrainResult, check_optimizer, prepare_data, train

SINK_SAMPLES = 10  # names handed to the log_to sinks at the end of a run
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
        if ckpt.best.stopped_at == ckpt.state.step:
            how = (f"stopped early at step {int(ckpt.state.step):,}: no lower validation loss in "
                   f"{ckpt.config.patience} rounds, {ckpt.best.describe()}")
        elif reached is not None and ckpt.state.step == reached.stop:
            how = f"stopped at step {int(ckpt.state.step):,} on reaching target_loss {ckpt.config.target_loss:g}"
        else:
            how = f"{ckpt.total_steps:,} steps"
        return (f"{self.run_dir.path} already finished ({how}); nothing to resume (pass --steps N to train on to "
                "N steps)")


def plan_fresh(registry: BackendRegistry, cfg: TrainConfig, *, backend: str | None = None, data: str | None = None,
               prepare: Prepare = prepare_data, out_option: str = "--out") -> RunPlan:
    """A new run of `cfg` (already built from its sources); backend and data are the caller's explicit choices
    (a flag, an argument, a sweep's resolved value), which outrank the environment and the config. out_option
    names cfg.out in errors."""
    check_memory(cfg, block_rows=LEAST_ROWS)  # before any download; the chosen backend's figure comes below
    check_installed(cfg)
    cfg = dataclasses.replace(cfg, backend=resolve_backend(backend, cfg.backend))
    given = given_data_path(data, cfg.data, data_format=cfg.data_format)
    if given is None and cfg.data_format == "lines":  # the makemore names: their vocabulary is known before the
        registry.select(cfg.backend, cfg.model_shape(NAMES_VOCAB), cfg.batch, cfg.dtype, cfg.precision)  # download
    cfg = dataclasses.replace(cfg, data=str(given or resolve_data_path(None, None, data_format=cfg.data_format)))
    prepared = prepare(cfg, None)
    # The data decides the vocabulary, and with it the shape a backend must run.
    shape = cfg.model_shape(prepared.vocab.size)
    entry = registry.select(cfg.backend, shape, cfg.batch, cfg.dtype, cfg.precision)
    check_memory(cfg, block_rows=entry.block_rows, block_bytes=entry.block_bytes, vocab=prepared.vocab.size)
    check_optimizer(entry, shape, cfg)
    run = RunDir.create(cfg.out, cfg, out_option)
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
    extend_to: train on to that many steps (the LR schedule re-spanned), also a finished run."""
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
        schedule = ckpt.config.schedule()
        nxt = int(ckpt.state.step) + 1
        note(f"extending to {extend_to:,} steps (from {ckpt.total_steps:,}): the learning rate schedule "
             f"({schedule.describe()}) spans all {extend_to:,}, so step {nxt:,} continues at "
             f"{schedule.at(nxt, extend_to):.3g}")
    elif ckpt.finished:
        return AlreadyFinished(run, ckpt)
    if changes:
        cfg = build_config([(changes_source, changes)], cfg)
    check_installed(cfg)
    entry = registry.select(cfg.backend, ckpt.shape, cfg.batch, cfg.dtype, cfg.precision)
    check_memory(cfg, block_rows=entry.block_rows, block_bytes=entry.block_bytes, vocab=ckpt.shape.vocab)
    check_optimizer(entry, ckpt.shape, cfg)  # the saved optimiser, on the backend this resume runs on
    chosen = entry.name
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
    """Claim the run directory (a second process training it stops here), train, release it. The sinks of
    `log_to` get the run's records and, at the end, ten sampled names (for a list; a text has no names)."""
    plan.run_dir.claim()
    try:
        sinks = open_sinks(plan.cfg, plan.run_dir.path)
        try:
            result = train(plan.cfg, registry, run_dir=plan.run_dir, resume=plan.resume,
                           reporter=SinkReporter(reporter or NullReporter(), sinks) if sinks else reporter,
                           data=plan.data, extend_to=plan.extend_to)
            if sinks and result.vocab.with_boundary:  # names end at the boundary; a text run has none
                names = generate(result.state.params, result.shape, result.vocab, n=SINK_SAMPLES, temperature=0.5,
                                 seed=plan.cfg.seed)
                for sink in sinks:
                    sink.samples(int(result.state.step), names)
            return result
        finally:
            for sink in sinks:
                sink.close()
    finally:
        plan.run_dir.release()
