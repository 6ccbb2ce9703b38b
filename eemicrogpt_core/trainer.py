"""The training loop: backend selection, chunked steps, validation, checkpoints, time budgets and resume.

Steps run in chunks (config.chunk_steps per backend call) so Python overhead is paid once per chunk; chunks
end on log boundaries so validation and checkpoints land on exact steps. The loss sequence does not depend
on the chunking, which is what makes `--resume` exact.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .backend import TrainState
from .checkpoint import Checkpoint, save_checkpoint
from .config import TrainConfig
from .data import BatchSampler, Dataset, encode, fixed_batches, read_names, split
from .errors import EemicrogptError
from .interrupt import deferred_sigint
from .model import init_params
from .optim import lr_schedule
from .registry import BackendEntry, BackendRegistry, open_session
from .rundir import RunDir

ROLLING = 100  # train loss is reported as the mean of the last 100 steps
WARMUP_STREAM = 3  # batch stream for the time-budget warm-up, so it never shifts the training batches


class TrainingDiverged(EemicrogptError):
    """The loss became NaN or infinite."""


@dataclass
class RunInfo:
    """What the run is about to do (for the reporter's header)."""

    backend: BackendEntry
    cfg: TrainConfig
    start_step: int
    total_steps: int
    n_train: int
    n_val: int
    n_truncated: int
    n_dropped: int
    run_dir: Path | None


class Reporter(Protocol):
    def start(self, info: RunInfo) -> None: ...
    def progress(self, step: int, total: int, train_loss: float) -> None: ...
    def log(self, record: dict[str, Any]) -> None: ...
    def message(self, text: str) -> None: ...
    def finish(self) -> None: ...


class NullReporter:
    def start(self, info: RunInfo) -> None:
        pass

    def progress(self, step: int, total: int, train_loss: float) -> None:
        pass

    def log(self, record: dict[str, Any]) -> None:
        pass

    def message(self, text: str) -> None:
        pass

    def finish(self) -> None:
        pass


@dataclass
class TrainResult:
    backend: str
    state: TrainState
    total_steps: int
    losses: np.ndarray  # per-step losses of this invocation (before each update)
    train_loss: float  # rolling mean of the last ROLLING steps
    val_loss: float | None
    train_seconds: float  # time inside backend train_steps calls
    interrupted: bool = False
    run_dir: Path | None = None
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def steps_run(self) -> int:
        return int(self.losses.size)

    @property
    def us_per_step(self) -> float:
        return 1e6 * self.train_seconds / max(self.steps_run, 1)

    @property
    def steps_per_s(self) -> float:
        return self.steps_run / self.train_seconds if self.train_seconds > 0 else 0.0


@dataclass
class PreparedData:
    train: Dataset
    val: Dataset
    n_truncated: int
    n_dropped: int


def prepare_data(cfg: TrainConfig) -> PreparedData:
    """Read cfg.data (already resolved to a path), encode it and split it with the run's seed."""
    if not cfg.data:
        raise EemicrogptError("no names file resolved for this run (internal: resolve cfg.data first)")
    names = read_names(cfg.data, drop_invalid=cfg.drop_invalid)
    data, n_truncated = encode(names.names)
    train, val = split(data, cfg.val_fraction, cfg.seed)
    return PreparedData(train, val, n_truncated, names.n_dropped)


def evaluate(session: Any, batches: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """Mean of the per-batch mean losses over fixed batches; the state is not changed."""
    return float(np.mean([session.loss_and_grads(t, ln, want_grads=False)[0] for t, ln in batches]))


def estimate_steps(session: Any, data: Dataset, cfg: TrainConfig, budget: float) -> int:
    """Steps that fit in `budget` seconds, from a timed warm-up on throwaway batches; state is restored.

    The per-step time is the median over several warm-up chunks, so one chunk slowed by a busy machine
    does not skew the estimate; the first chunk (cold caches, lazy set-up) is not counted.
    """
    saved = session.get_state()
    sampler = BatchSampler(data, cfg.batch, cfg.seed, stream=WARMUP_STREAM)
    target = min(0.1 * budget, 1.0)  # time spent measuring: at most a tenth of the budget
    n, spent, per_step = 2, 0.0, []
    for i in range(64):
        tokens, lengths = sampler.sample(n)
        t0 = time.perf_counter()
        session.train_steps(tokens, lengths, np.full(n, cfg.lr, np.float32))
        dt = time.perf_counter() - t0
        if i == 0:
            continue
        spent += dt
        per_step.append(dt / n)
        if spent >= target and len(per_step) >= 3:
            break
        n = min(2 * n, 1000)
    session.set_state(saved)
    return max(1, int(budget / statistics.median(per_step)))


def train(
    cfg: TrainConfig,
    registry: BackendRegistry,
    *,
    run_dir: RunDir | None = None,
    resume: Checkpoint | None = None,
    reporter: Reporter | None = None,
    data: PreparedData | None = None,
) -> TrainResult:
    """Train cfg (backend and data already resolved) and return the result; Ctrl-C saves and returns."""
    reporter = reporter or NullReporter()
    shape = cfg.shape
    entry = registry.select(cfg.backend, shape, cfg.batch, cfg.dtype)
    data = data or prepare_data(cfg)
    sampler = BatchSampler(data.train, cfg.batch, cfg.seed)
    val_batches = fixed_batches(data.val, cfg.batch, cfg.eval_batches)
    recent: deque[float] = deque(maxlen=ROLLING)

    with open_session(entry, shape, cfg.batch, cfg.dtype) as session:
        if resume is not None:
            session.set_state(resume.state)
            sampler.set_state(resume.sampler_state)
            recent.extend(resume.recent_losses)
            total = resume.total_steps
        else:
            session.set_state(TrainState.fresh(init_params(shape, cfg.seed)))
            total = cfg.steps if cfg.time_budget is None else estimate_steps(session, data.train, cfg, cfg.time_budget)
        step = int(session.get_state().step)
        if run_dir is not None:
            run_dir.write_config(cfg)
            run_dir.keep_metrics_until(step)

        def checkpoint() -> None:
            if run_dir is not None:
                ckpt = Checkpoint(session.get_state(), total, sampler.get_state(), cfg, list(recent), entry.name)
                save_checkpoint(run_dir.checkpoint_path, ckpt)

        info = RunInfo(entry, cfg, step, total, len(data.train), len(data.val), data.n_truncated,
                       data.n_dropped, run_dir.path if run_dir else None)
        reporter.start(info)
        chunks: list[np.ndarray] = []
        records: list[dict[str, Any]] = []
        seconds, val_loss, interrupted = 0.0, None, False
        consistent = True  # False while a backend call is in flight: its state cannot be saved then
        started = time.perf_counter()
        try:
            note = "Ctrl-C: stopping after this chunk (press again to abort)"
            with deferred_sigint(lambda: reporter.message(note)) as stop:
                while step < total and not stop.requested:
                    next_log = (step // cfg.log_every + 1) * cfg.log_every
                    n = min(cfg.chunk_steps, total - step, next_log - step)
                    tokens, lengths = sampler.sample(n)
                    lrs = lr_schedule(step + 1, n, total, cfg.lr)
                    consistent = False
                    t0 = time.perf_counter()
                    losses = np.asarray(session.train_steps(tokens, lengths, lrs), dtype=np.float32)
                    seconds += time.perf_counter() - t0
                    step += n
                    consistent = True
                    chunks.append(losses)
                    recent.extend(losses.tolist())
                    if not np.all(np.isfinite(losses)):
                        i = int(np.argmin(np.isfinite(losses)))
                        raise TrainingDiverged(
                            f"the loss became {losses[i]} at step {step - n + 1 + i}; try a lower --lr (now {cfg.lr})"
                        )
                    reporter.progress(step, total, float(np.mean(recent)))
                    if step % cfg.log_every == 0 or step == total:
                        val_loss = evaluate(session, val_batches)
                        done = sum(c.size for c in chunks)
                        record = {
                            "step": step,
                            "train_loss": float(np.mean(recent)),
                            "val_loss": val_loss,
                            "lr": float(lrs[-1]),
                            "elapsed_s": round(time.perf_counter() - started, 4),
                            "us_per_step": round(1e6 * seconds / done, 3),
                        }
                        records.append(record)
                        if run_dir is not None:
                            run_dir.append_metric(record)
                        checkpoint()
                        reporter.log(record)
                if stop.requested and step < total:
                    interrupted = True
                    checkpoint()
                    reporter.message(f"stopped at step {step}/{total}; checkpoint saved")
        except KeyboardInterrupt:
            interrupted = True
            if consistent:
                checkpoint()
                reporter.message(f"interrupted at step {step}/{total}; checkpoint saved")
            else:
                reporter.message("interrupted inside a backend call; the last saved checkpoint is kept")
        finally:
            reporter.finish()
        state = session.get_state()

    losses_all = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    return TrainResult(
        backend=entry.name,
        state=state,
        total_steps=total,
        losses=losses_all,
        train_loss=float(np.mean(recent)) if recent else float("nan"),
        val_loss=val_loss,
        train_seconds=seconds,
        interrupted=interrupted,
        run_dir=run_dir.path if run_dir else None,
        records=records,
    )
