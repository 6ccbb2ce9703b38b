"""The training loop: backend selection, chunked steps, validation, checkpoints, time budgets and resume.

Steps run in chunks of up to config.chunk_steps per backend call, so Python overhead is paid once per chunk
(fewer steps on slow backends: about CHUNK_SECONDS each); chunks end on log boundaries so validation and
checkpoints land on exact steps. The loss sequence does not depend on the chunking, which is what makes
`--resume` exact.
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
CHUNK_SECONDS = 0.25  # slow backends get shorter chunks, so progress and Ctrl-C stay responsive


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


class _Run:
    """One invocation of the loop: the session, the sampler and the bookkeeping the steps share."""

    def __init__(self, cfg: TrainConfig, entry: BackendEntry, session: Any, data: PreparedData,
                 run_dir: RunDir | None, resume: Checkpoint | None) -> None:
        self.cfg, self.entry, self.session, self.run_dir = cfg, entry, session, run_dir
        self.sampler = BatchSampler(data.train, cfg.batch, cfg.seed)
        self.val_batches = fixed_batches(data.val, cfg.batch, cfg.eval_batches)
        self.recent: deque[float] = deque(maxlen=ROLLING)
        if resume is not None:
            session.set_state(resume.state)
            self.sampler.set_state(resume.sampler_state)
            self.recent.extend(resume.recent_losses)
            self.total = resume.total_steps
        else:
            session.set_state(TrainState.fresh(init_params(cfg.shape, cfg.seed)))
            budget = cfg.time_budget
            self.total = cfg.steps if budget is None else estimate_steps(session, data.train, cfg, budget)
        self.step = int(session.get_state().step)
        self.chunks: list[np.ndarray] = []
        self.records: list[dict[str, Any]] = []
        self.seconds = 0.0  # inside train_steps only
        self.val_loss: float | None = None
        self.last_lr = float("nan")
        self.chunk_limit = min(8, cfg.chunk_steps)  # grows to cfg.chunk_steps once the step time is known
        self.started = time.perf_counter()

    @property
    def train_loss(self) -> float:
        return float(np.mean(self.recent)) if self.recent else float("nan")

    def chunk(self) -> None:
        """The next chunk of steps; it ends on a log boundary so validation lands on exact steps."""
        cfg, step = self.cfg, self.step
        n = min(self.chunk_limit, self.total - step, (step // cfg.log_every + 1) * cfg.log_every - step)
        tokens, lengths = self.sampler.sample(n)
        lrs = lr_schedule(step + 1, n, self.total, cfg.lr)
        t0 = time.perf_counter()
        losses = np.asarray(self.session.train_steps(tokens, lengths, lrs), dtype=np.float32)
        elapsed = time.perf_counter() - t0
        self.seconds += elapsed
        self.chunk_limit = max(1, min(cfg.chunk_steps, int(CHUNK_SECONDS * n / max(elapsed, 1e-9))))
        self.step += n
        self.chunks.append(losses)
        self.recent.extend(losses.tolist())
        self.last_lr = float(lrs[-1])
        if not np.all(np.isfinite(losses)):
            i = int(np.argmin(np.isfinite(losses)))
            bad = f"the loss became {losses[i]} at step {step + 1 + i}"
            raise TrainingDiverged(f"{bad}; try a lower --lr (now {cfg.lr})")

    def at_log_step(self) -> bool:
        return self.step % self.cfg.log_every == 0 or self.step == self.total

    def log(self) -> dict[str, Any]:
        """Validation loss and a metrics record; the checkpoint is saved with it."""
        self.val_loss = evaluate(self.session, self.val_batches)
        done = sum(c.size for c in self.chunks)
        record = {
            "step": self.step,
            "train_loss": self.train_loss,
            "val_loss": self.val_loss,
            "lr": self.last_lr,
            "elapsed_s": round(time.perf_counter() - self.started, 4),
            "us_per_step": round(1e6 * self.seconds / done, 3),
        }
        self.records.append(record)
        if self.run_dir is not None:
            self.run_dir.append_metric(record)
        self.checkpoint()
        return record

    def checkpoint(self) -> str:
        """Save (when there is a run directory); returns a phrase for the user."""
        if self.run_dir is None:
            return "no run directory, nothing saved"
        state = self.session.get_state()
        ckpt = Checkpoint(state, self.total, self.sampler.get_state(), self.cfg, list(self.recent), self.entry.name)
        save_checkpoint(self.run_dir.checkpoint_path, ckpt)
        return "checkpoint saved"

    def result(self, interrupted: bool) -> TrainResult:
        return TrainResult(
            backend=self.entry.name,
            state=self.session.get_state(),
            total_steps=self.total,
            losses=np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32),
            train_loss=self.train_loss,
            val_loss=self.val_loss,
            train_seconds=self.seconds,
            interrupted=interrupted,
            run_dir=self.run_dir.path if self.run_dir else None,
            records=self.records,
        )


def train(
    cfg: TrainConfig,
    registry: BackendRegistry,
    *,
    run_dir: RunDir | None = None,
    resume: Checkpoint | None = None,
    reporter: Reporter | None = None,
    data: PreparedData | None = None,
) -> TrainResult:
    """Train cfg (backend and data already resolved) and return the result; Ctrl-C saves and returns.

    The first Ctrl-C stops at the next chunk boundary; a KeyboardInterrupt between chunks (a second Ctrl-C,
    or one raised by a reporter) also saves, while one inside a backend call keeps the last checkpoint,
    because the state in the middle of a chunk matches no step.
    """
    reporter = reporter or NullReporter()
    entry = registry.select(cfg.backend, cfg.shape, cfg.batch, cfg.dtype)
    data = data or prepare_data(cfg)
    with open_session(entry, cfg.shape, cfg.batch, cfg.dtype, cfg.threads) as session:
        run = _Run(cfg, entry, session, data, run_dir, resume)
        if run_dir is not None:
            run_dir.write_config(cfg)
            run_dir.keep_metrics_until(run.step)
        reporter.start(RunInfo(entry, cfg, run.step, run.total, len(data.train), len(data.val), data.n_truncated,
                               data.n_dropped, run_dir.path if run_dir else None))
        interrupted, in_chunk = False, False
        try:
            note = "Ctrl-C: stopping after this chunk (press again to abort)"
            with deferred_sigint(lambda: reporter.message(note)) as stop:
                while run.step < run.total and not stop.requested:
                    in_chunk = True
                    run.chunk()
                    in_chunk = False
                    if run.at_log_step():  # before the progress callback, so an interrupt there keeps the log
                        reporter.log(run.log())
                    reporter.progress(run.step, run.total, run.train_loss)
                if stop.requested and run.step < run.total:
                    interrupted = True
                    reporter.message(f"stopped at step {run.step}/{run.total}; {run.checkpoint()}")
        except KeyboardInterrupt:
            interrupted = True
            if in_chunk:
                saved = run_dir is not None and run_dir.checkpoint_path.exists()
                kept = "the last saved checkpoint is kept" if saved else "nothing was saved yet"
                reporter.message(f"interrupted inside a backend call; {kept}")
            else:
                reporter.message(f"interrupted at step {run.step}/{run.total}; {run.checkpoint()}")
        finally:
            reporter.finish()
        return run.result(interrupted)
