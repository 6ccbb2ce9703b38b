"""The training loop: backend selection, chunked steps, validation, checkpoints, time budgets and resume.

Steps run in chunks of up to config.chunk_steps per backend call, so Python overhead is paid once per chunk
(fewer steps on slow backends: about CHUNK_SECONDS each); chunks end on log boundaries so validation and
checkpoints land on exact steps. The loss sequence does not depend on the chunking, which is what makes
`--resume` exact. With a target_loss the run also ends (logged and saved) after the chunk in which the
train loss first reached it (target.py says which step and which seconds count); with a patience, at the
validation round that runs it out (best.py), and keep_best saves best.npz at every round that improves.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..backends.adaptive_threads import AdaptiveThreads, auto_candidates
from ..backends.backend import BackendSession, TrainState
from ..backends.registry import BackendEntry, BackendRegistry, open_session
from ..backends.session_checks import CheckedSession, nonfinite_part
from ..backends.validate import ValidatedSession
from ..base.errors import (
    BackendOutputError,
    BackendSelectionError,
    ConfigError,
    EemicrogptError,
    NonFiniteError,
    StorageError,
    describe_os_error,
)
from ..data.names import Dataset, SeededSampler, encode, read_names, split
from ..data.text import TextPart, read_text, split_text
from ..model.sampling import summary_sample
from ..model.shape import ModelShape, init_params
from ..model.vocab import Vocabulary
from .best import BestSoFar
from .checkpoint import Checkpoint, save_checkpoint, software_versions
from .config import MAX_STEPS, PRESETS, TrainConfig
from .contention import Contention, cpus_available, load_average
from .interrupt import deferred_stop, signal_name
from .rundir import RunDir
from .target import ROLLING, TargetOutcome, TargetReached, first_reached, seconds_within

WARMUP_STREAM = 3  # batch stream for the time-budget warm-up, so it never shifts the training batches
CHUNK_SECONDS = 0.25  # slow backends get shorter chunks, so progress and Ctrl-C stay responsive
# A time-budget run re-sizes its total from its own chunks until this share of the budget has trained: the
# warm-up's estimate misses by the first calls' costs and by a machine that got busier or quieter (a 1 s run
# sized by the warm-up alone trained 0.82-1.04 s, d16 on two Zen 4 threads), and the later the total
# changes, the larger the step it makes in the learning-rate schedule.
RESIZE_UNTIL = 0.5
# Its chunks are at most this share of the budget, so that several of them fall before RESIZE_UNTIL.
BUDGET_CHUNK_SHARE = 1 / 40


class TrainingDiverged(EemicrogptError):
    """The loss (or the parameters) became NaN or infinite."""


# A mean train loss above this many times ln(vocab) (what guessing uniformly scores; an untrained model starts
# near it) is divergence even when finite: lr 1e6 reaches 1e18 without overflowing float32.
DIVERGED_LOSS_FACTOR = 10


def _is_nonfinite_error(e: Exception) -> bool:
    """A backend's way of saying "non-finite": NonFiniteError (native sessions and numpy_ref raise it); a
    third-party Python backend may let numpy's FloatingPointError through."""
    return isinstance(e, (NonFiniteError, FloatingPointError))


def lower_lr(lr: float, d_model: int) -> float:
    """The --lr to suggest after a divergence: a tenth of this one, or the size's usual rate when this one is
    far above it (a tenth of 1e30 diverges just the same)."""
    usual = PRESETS.get(d_model, {}).get("lr", TrainConfig.lr)
    return usual if lr > 10 * usual else lr / 10


@dataclass
class _Snapshot:
    """The last state known to be good (the start, or the last log step) and where the batches stood."""

    state: TrainState
    sampler_state: dict[str, Any]


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
    shape: ModelShape
    vocab: Vocabulary
    data_note: str = ""  # how the data was split when that is not the plain split
    backend_note: str = ""  # why auto settled for a slower backend
    data_unit: str = "names"  # what n_train and n_val count: names, or a text's characters
    data_hint: str = ""  # a suggestion about the data (a list file that looks like running text)


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
    val_loss: float | None  # None without a validation split
    shape: ModelShape
    vocab: Vocabulary
    train_seconds: float  # time inside backend train_steps calls
    interrupted: bool = False
    run_dir: Path | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    stop_signal: int | None = None  # the signal that stopped the run, if one did
    contention: Contention | None = None  # time-budget runs: how busy the machine was
    target: TargetOutcome | None = None  # runs with a target_loss: whether and when the train loss reached it
    best: BestSoFar | None = None  # runs with keep_best or patience: the lowest validation loss and its step

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
    """A run's data, ready for batches: names (Dataset) or a text's parts (TextPart), which both give a seeded
    sampler (`sampler`) and fixed validation batches (`batches`)."""

    train: Dataset | TextPart
    val: Dataset | TextPart | None  # None: no validation split
    n_truncated: int
    n_dropped: int
    vocab: Vocabulary
    data_sha256: str = ""  # fingerprint of the data file, stored in checkpoints to check resumes
    note: str = ""  # the split's note (data.Split.note), or where a text was split
    unit: str = "names"  # what len(train) and len(val) count
    hint: str = ""  # a list file that looks like running text: the suggestion to pass --text


def looks_like_text(names: list[str], n_truncated: int) -> str:
    """The reason a list file looks like running text (most lines longer than the context, or most lines of
    several words: a list's items are a word or two), or "" when it looks like a list."""
    if len(names) >= 2 and n_truncated > len(names) / 2:
        return f"{n_truncated:,} of its {len(names):,} lines are longer than the context"
    wordy = sum(1 for name in names if name.count(" ") >= 3)
    if len(names) >= 2 and wordy > len(names) / 2:
        return f"{wordy:,} of its {len(names):,} lines have four or more words"
    return ""


def prepare_data(cfg: TrainConfig, vocab: Vocabulary | None = None) -> PreparedData:
    """Read cfg.data (already resolved to a path) in its data_format, build its vocabulary (or check it against
    `vocab`, a resumed run's table), encode it at cfg.context and split it with the run's seed."""
    if not cfg.data:
        raise EemicrogptError("no data file resolved for this run (internal: resolve cfg.data first)")
    if cfg.data_format == "text":
        text = read_text(cfg.data, lowercase=cfg.lowercase, vocab=vocab)
        cut = split_text(text, cfg.context, cfg.val_fraction)
        at = (f"the first {cut.at:,} characters train, the last {len(text.tokens) - cut.at:,} validate"
              if cut.validation is not None else "no validation split (val_fraction 0): only the train loss "
              "is measured")
        return PreparedData(cut.train, cut.validation, 0, 0, text.vocab, text.sha256, at, "characters")
    names = read_names(cfg.data, drop_invalid=cfg.drop_invalid, lowercase=cfg.lowercase, vocab=vocab)
    vocab = vocab or Vocabulary.from_names(names.names)
    data, n_truncated = encode(names.names, vocab, cfg.context)
    parts = split(data, cfg.val_fraction, cfg.seed)
    why = looks_like_text(names.names, n_truncated)
    hint = f"this file looks like running text ({why}); pass --text to train on it as one stream" if why else ""
    return PreparedData(parts.train, parts.validation, n_truncated, names.n_dropped, vocab, names.sha256, parts.note,
                        hint=hint)


def evaluate(session: BackendSession, batches: list[tuple[np.ndarray, np.ndarray]],
             on_batch: Callable[[int, int], None] | None = None) -> float | None:
    """Mean loss per predicted token over fixed batches (None without any): each batch's mean weighted by its
    predictions, so batches of different sizes (a text's last window, a short last batch) count fairly and
    `eval` on the held-out part gives the validation line's figure. The state is not changed. Overflow is not
    warned about: the caller checks that the mean is finite. on_batch(done, total) after each batch."""
    if not batches:
        return None
    counts = np.array([int(np.sum(ln.astype(np.int64) - 1)) for _, ln in batches], dtype=np.float64)
    losses = np.empty(len(batches), np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        for i, (tokens, lengths) in enumerate(batches):
            losses[i] = session.loss_and_grads(tokens, lengths, want_grads=False)[0]
            if on_batch is not None:
                on_batch(i + 1, len(batches))
        return float(np.sum(losses * counts) / np.sum(counts))


# A warm-up chunk counts once it takes this share of the warm-up's time: smaller ones are dominated by the first
# calls' costs (thread wake-ups, cold caches, page faults) that the run's long chunks do not pay. Timing the
# doubling chunks instead sized a 1 s run on two x86 threads for 0.82 s of training (d16, Zen 4).
STEADY_SHARE = 1 / 20
MAX_WARMUP_CHUNK = 1000  # steps


def _warmup_per_step(session: BackendSession, sampler: SeededSampler, lr: float, target: float,
                     clock: Callable[[], float]) -> list[float]:
    """Seconds per step of the steady warm-up chunks: chunks double (the first, cold one not timed) until one
    takes STEADY_SHARE of `target` (or reaches MAX_WARMUP_CHUNK steps); chunks of that size then run until
    `target` seconds are spent, at least three of them, and their per-step times are returned."""
    n, spent = 2, 0.0
    steady: list[float] = []
    for i in range(256):
        tokens, lengths = sampler.sample(n)
        t0 = clock()
        session.train_steps(tokens, lengths, np.full(n, lr, np.float32))
        dt = clock() - t0
        if i == 0:
            continue
        spent += dt
        if steady or dt >= STEADY_SHARE * target or n >= MAX_WARMUP_CHUNK:
            steady.append(dt / n)
            if spent >= target and len(steady) >= 3:
                break
        else:
            n = min(2 * n, MAX_WARMUP_CHUNK)
    return steady


def estimate_steps(session: BackendSession, data: Dataset | TextPart, cfg: TrainConfig, budget: float,
                   threads: AdaptiveThreads | None = None,
                   clock: Callable[[], float] | None = None) -> tuple[int, float]:
    """Steps that fit in `budget` seconds, from a timed warm-up on throwaway batches, and the fastest warm-up
    chunk's seconds per step (the calibration contention.py compares the run with); state is restored.

    The per-step time is the median over the steady warm-up chunks (see _warmup_per_step), so one chunk slowed
    by a busy machine does not skew the estimate. With threads: auto (`threads`), every candidate count is
    warmed up and timed, the fastest is the one the run starts with, and the steps are sized by its time:
    timing one count and training on another sized a run for a tenth of its budget when a busy core made one
    thread faster.
    """
    clock = clock or time.perf_counter  # looked up per call: the run's chunks are timed by the same clock
    saved = session.get_state()
    sampler = data.sampler(cfg.batch, cfg.seed, stream=WARMUP_STREAM)
    target = min(0.1 * budget, 1.0)  # time spent measuring: at most a tenth of the budget
    if threads is None:
        per_step = _warmup_per_step(session, sampler, cfg.lr, target, clock)
    else:
        counts = threads.chooser.candidates
        timed = {}
        for count in counts:
            used = threads.use(count)  # first: the warm-up below must run at this count
            timed[used] = _warmup_per_step(session, sampler, cfg.lr, target / len(counts), clock)
        medians = {count: statistics.median(times) for count, times in timed.items()}
        best = min(medians, key=lambda count: medians[count])
        threads.use(best)
        threads.chooser.settle_on(best, medians)
        per_step = timed[best]
    session.set_state(saved)
    steps = min(MAX_STEPS, max(1, int(budget / statistics.median(per_step))))  # the cap every run shares
    return steps, min(per_step)


def apply_optimizer(session: ValidatedSession, cfg: TrainConfig) -> None:
    """Hand cfg's optimiser to the session; default settings call nothing (the run is the original Adam's, bit for
    bit, on every backend), others on a session without set_optimizer are one line naming the backend and them."""
    opt = cfg.optimizer()
    if opt.is_default:
        return
    if not session.takes_optimizer:
        raise BackendSelectionError(
            f"backend '{session.backend_name}' cannot run {', '.join(cfg.optimizer_changes())}: its sessions have no "
            "set_optimizer, so they run only the default optimiser; leave the optimiser keys at their defaults or "
            "pick another backend")
    session.set_optimizer(opt)


def check_optimizer(entry: BackendEntry, shape: ModelShape, cfg: TrainConfig) -> None:
    """Refuse cfg's optimiser on a backend that cannot run it before anything is written: a session of the run's
    shape (batch 1, one thread) is opened and given it, then closed. Default settings open nothing."""
    if cfg.optimizer().is_default:
        return
    with open_session(entry, shape, 1, cfg.dtype, threads=1) as session:
        apply_optimizer(session, cfg)


class _Run:
    """One invocation of the loop: the session, the sampler and the bookkeeping the steps share."""

    def __init__(self, cfg: TrainConfig, entry: BackendEntry, session: BackendSession, data: PreparedData,
                 shape: ModelShape, run_dir: RunDir | None, resume: Checkpoint | None,
                 extend_to: int | None = None, adaptive: AdaptiveThreads | None = None) -> None:
        self.cfg, self.entry, self.session, self.run_dir = cfg, entry, session, run_dir
        self.schedule = cfg.schedule()
        self.load_start: float | None = None
        self.calibration_s: float | None = None  # set for a fresh time-budget run
        self.budget: float | None = None  # the same: its seconds, while the total may still be re-sized
        self.timed_steps, self.timed_seconds = 0, 0.0  # the chunks after the first, which pays the cold start
        self.shape, self.vocab = shape, data.vocab
        self.data_sha256 = data.data_sha256
        self.train_part = data.train
        self.sampler = data.train.sampler(cfg.batch, cfg.seed)
        self.val_batches = [] if data.val is None else data.val.batches(cfg.batch, cfg.eval_batches, cfg.seed)
        self.recent: deque[float] = deque(maxlen=ROLLING)
        # Training seconds of the earlier invocations, and where the target was reached (if it was).
        self.seconds_before = resume.train_seconds if resume is not None else 0.0
        self.reached: TargetReached | None = resume.target_reached if resume is not None else None
        self.at_target = False  # this invocation reached the target: it stops after that chunk
        self.tracks_best = cfg.keep_best or cfg.patience is not None
        self.best = dataclasses.replace(resume.best) if resume is not None else BestSoFar()
        if extend_to is not None:  # an extension trains on past an early stop, counting rounds afresh
            self.best.stopped_at, self.best.stale_rounds = None, 0
        if resume is not None:
            session.set_state(resume.state)
            self.sampler.set_state(resume.sampler_state)
            self.recent.extend(resume.recent_losses)
            self.total = resume.total_steps if extend_to is None else extend_to
        else:
            session.set_state(TrainState.fresh(init_params(shape, cfg.seed)))
            budget = cfg.time_budget
            self.total = cfg.steps
            if budget is not None:
                self.load_start = load_average()
                self.total, self.calibration_s = estimate_steps(session, data.train, cfg, budget, adaptive)
                self.budget = budget
        start = session.get_state()
        self.step = int(start.step)
        self.good = _Snapshot(start, self.sampler.get_state())
        self.saved_step: int | None = resume.state.step if resume is not None else None
        self.chunks: list[np.ndarray] = []
        self.records: list[dict[str, Any]] = []
        self.seconds = 0.0  # inside train_steps only
        self.val_loss: float | None = None
        self.last_lr = float("nan")
        self.chunk_limit = min(8, cfg.chunk_steps)  # grows to cfg.chunk_steps once the step time is known
        self.seconds_per_step: float | None = None  # of the last chunk
        self.adaptive = adaptive  # threads: auto
        self.thread_note: str | None = None  # what threads: auto decided after the last chunk
        # elapsed_s continues across resumes: it starts from the last record this run kept before now.
        earlier = run_dir.read_metrics() if run_dir is not None and resume is not None else []
        self.elapsed_before = max((float(r.get("elapsed_s", 0.0)) for r in earlier
                                   if r["step"] <= self.step and isinstance(r.get("elapsed_s"), (int, float))),
                                  default=0.0)
        self.started = time.perf_counter()

    @property
    def train_loss(self) -> float:
        return float(np.mean(self.recent)) if self.recent else float("nan")

    def chunk(self) -> None:
        """The next chunk of steps; it ends on a log boundary so validation lands on exact steps."""
        cfg, step = self.cfg, self.step
        n = min(self.chunk_limit, self.total - step, (step // cfg.log_every + 1) * cfg.log_every - step)
        if self.adaptive is not None:  # the count for this chunk; short chunks while counts are timed
            n = self.adaptive.before_chunk(n, self.seconds_per_step)
        tokens, lengths = self.sampler.sample(n)
        lrs = self.schedule.rates(step + 1, n, self.total)
        t0 = time.perf_counter()
        try:
            losses = np.asarray(self.session.train_steps(tokens, lengths, lrs), dtype=np.float32)
        except Exception as e:  # not KeyboardInterrupt (a BaseException): that stops the run
            # NonFiniteError is an EemicrogptError too: test for it before letting user errors through
            if not _is_nonfinite_error(e):
                raise
            raise self._locate_divergence(step + n, e) from None
        elapsed = time.perf_counter() - t0
        if cfg.target_loss is not None and cfg.target_metric == "train" and self.reached is None:
            k = first_reached(self.recent, losses, cfg.target_loss)
            if k is not None:
                seconds = seconds_within(self.seconds_before + self.seconds, elapsed, k + 1, n)
                self.reached, self.at_target = TargetReached(step + k + 1, seconds, step + n), True
        self.seconds += elapsed
        self.seconds_per_step = elapsed / n
        if self.adaptive is not None:
            self.thread_note = self.adaptive.after_chunk(n, elapsed)
        chunk_seconds = CHUNK_SECONDS if self.budget is None else min(CHUNK_SECONDS, BUDGET_CHUNK_SHARE * self.budget)
        self.chunk_limit = max(1, min(cfg.chunk_steps, int(chunk_seconds * n / max(elapsed, 1e-9))))
        if self.chunks:
            self.timed_steps, self.timed_seconds = self.timed_steps + n, self.timed_seconds + elapsed
        self.step += n
        self._resize()
        self.chunks.append(losses)
        self.recent.extend(losses.tolist())
        self.last_lr = float(lrs[-1])
        if not np.all(np.isfinite(losses)):
            i = int(np.argmin(np.isfinite(losses)))
            raise self._diverged(f"the loss became {losses[i]} at step {step + 1 + i}")

    def _resize(self) -> None:
        """A time-budget run's total from the steps it has timed, until RESIZE_UNTIL of its budget is spent."""
        if self.budget is None or not self.timed_steps:
            return
        if self.seconds >= RESIZE_UNTIL * self.budget:
            self.budget = None  # the total is final from here
            return
        per_step = self.timed_seconds / self.timed_steps
        left = max(0.0, self.budget - self.seconds)
        self.total = min(MAX_STEPS, self.step + max(1, int(left / per_step)))

    def kept(self) -> str:
        """What is on disk after a failure."""
        if self.run_dir is None:
            return "no run directory, nothing saved"
        if self.saved_step is None:
            return f"nothing was saved (the first checkpoint comes at step {self.cfg.log_every})"
        return f"the last good checkpoint (step {self.saved_step}) is kept in {self.run_dir.path}"

    def _diverged(self, what: str) -> TrainingDiverged:
        """The one-line error: what happened, what is kept on disk, what to try."""
        lr = self.cfg.lr
        return TrainingDiverged(f"training diverged: {what}; {self.kept()}; try a lower --lr (now {lr:g}, e.g. "
                                f"{lower_lr(lr, self.cfg.d_model):g})")

    def _locate_divergence(self, chunk_end: int, error: Exception) -> TrainingDiverged:
        """The backend failed somewhere in a chunk without saying where: replay one step at a time from the last
        good state (same batches, same LRs) to find the step and its loss."""
        self.session.set_state(self.good.state)
        sampler = self.train_part.sampler(self.cfg.batch, self.cfg.seed)
        sampler.set_state(self.good.sampler_state)
        for step in range(int(self.good.state.step) + 1, chunk_end + 1):
            tokens, lengths = sampler.sample(1)
            try:
                loss = float(self.session.train_steps(tokens, lengths, self.schedule.rates(step, 1, self.total))[0])
            except Exception as e:
                if not _is_nonfinite_error(e):
                    raise
                return self._diverged(f"at step {step} the backend reported: {e}")
            if not np.isfinite(loss):
                return self._diverged(f"the loss became {loss} at step {step}")
        return self._diverged(f"between steps {self.step + 1} and {chunk_end} the backend reported: {error}")

    def at_log_step(self) -> bool:
        return self.step % self.cfg.log_every == 0 or self.step == self.total or self.at_target

    @property
    def target(self) -> TargetOutcome | None:
        return TargetOutcome.of_run(self.cfg, self.reached)

    def sample(self) -> str:
        """summary_sample of the parameters just logged, seeded by the run's seed and the step (the training's
        own random streams are not touched)."""
        line = summary_sample(self.good.state.params, self.shape, self.vocab, self.cfg.seed + self.step)
        return f"step {self.step:,} {line}"

    def log(self) -> dict[str, Any]:
        """Validation loss and a metrics record; the checkpoint is saved with it."""
        state = self.session.get_state()
        if nonfinite_part(state) is not None:
            raise self._diverged(f"the parameters became non-finite by step {self.step}")
        bound = DIVERGED_LOSS_FACTOR * math.log(self.shape.vocab)
        if self.train_loss > bound:  # finite, but no model that learned anything is this far off
            raise self._diverged(f"the train loss reached {self.train_loss:.3g} by step {self.step}, over "
                                 f"{DIVERGED_LOSS_FACTOR}x the {math.log(self.shape.vocab):.3g} of a uniform guess")
        self.good = _Snapshot(state, self.sampler.get_state())
        try:
            self.val_loss = evaluate(self.session, self.val_batches)
        except Exception as e:
            if not _is_nonfinite_error(e):
                raise
            raise self._diverged(f"the validation loss at step {self.step} is not finite ({e})") from None
        if self.val_loss is not None and not np.isfinite(self.val_loss):
            raise self._diverged(f"the validation loss became {self.val_loss} at step {self.step}")
        goal = self.cfg.target_loss
        if (goal is not None and self.cfg.target_metric == "val" and self.reached is None
                and self.val_loss is not None and self.val_loss <= goal):
            self.reached = TargetReached(self.step, self.seconds_before + self.seconds, self.step)
            self.at_target = True
        improved = False
        if self.tracks_best and self.val_loss is not None:
            improved = self.best.observe(self.step, self.val_loss)
            if self.best.out_of_patience(self.cfg.patience) and self.step < self.total:
                self.best.stopped_at = self.step
        done = sum(c.size for c in self.chunks)
        record = {
            "step": self.step,
            "train_loss": self.train_loss,
            "val_loss": self.val_loss,
            "lr": self.last_lr,
            "elapsed_s": round(self.elapsed_before + time.perf_counter() - self.started, 4),
            "us_per_step": round(1e6 * self.seconds / done, 3),
        }
        target = self.target
        if target is not None and (self.at_target or self.step == self.total):  # the run's last record
            record.update(target.as_record())
        self.records.append(record)
        if self.run_dir is not None:
            try:
                self.run_dir.append_metric(record)
            except OSError as e:
                raise StorageError(describe_os_error(e, "cannot append to the metrics log")) from None
        self.checkpoint(state, also_best=improved and self.cfg.keep_best)
        return record

    @property
    def stopped_early(self) -> bool:
        return self.best.stopped_at is not None and self.best.stopped_at == self.step

    def checkpoint(self, state: TrainState | None = None, also_best: bool = False) -> str:
        """Save (when there is a run directory), also as best.npz when asked; returns a phrase for the user."""
        if self.run_dir is None:
            return "no run directory, nothing saved"
        state = state if state is not None else self.session.get_state()
        if nonfinite_part(state) is not None:
            raise self._diverged(f"the {nonfinite_part(state)} became non-finite by step {self.step}")
        ckpt = Checkpoint(state, self.total, self.sampler.get_state(), self.cfg, self.vocab, list(self.recent),
                          self.entry.name, self.data_sha256,
                          software_versions(f"{self.entry.distribution} {self.entry.version}"),
                          self.seconds_before + self.seconds, self.reached, dataclasses.replace(self.best))
        try:
            save_checkpoint(self.run_dir.checkpoint_path, ckpt)
            if also_best:  # after the last checkpoint: best.npz never holds a step checkpoint.npz lacks
                save_checkpoint(self.run_dir.best_path, ckpt)
        except OSError as e:
            kept = "nothing saved" if self.saved_step is None else f"the checkpoint of step {self.saved_step} is kept"
            raise StorageError(describe_os_error(e, "cannot save the checkpoint") + f" ({kept})") from None
        self.saved_step = int(state.step)
        return "checkpoint saved"

    def contention(self) -> Contention | None:
        """For a time-budget run: how busy the machine was around it."""
        done = sum(c.size for c in self.chunks)
        if self.calibration_s is None or not done:
            return None
        return Contention(self.load_start, load_average(), 1e6 * self.calibration_s, 1e6 * self.seconds / done,
                          cpus_available())

    def result(self, interrupted: bool, stop_signal: int | None = None) -> TrainResult:
        return TrainResult(
            backend=self.entry.name,
            state=self.session.get_state(),
            total_steps=self.total,
            losses=np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32),
            train_loss=self.train_loss,
            val_loss=self.val_loss,
            shape=self.shape,
            vocab=self.vocab,
            train_seconds=self.seconds,
            interrupted=interrupted,
            run_dir=self.run_dir.path if self.run_dir else None,
            records=self.records,
            stop_signal=stop_signal,
            contention=self.contention(),
            target=self.target,
            best=dataclasses.replace(self.best) if self.tracks_best else None,
        )


def train(
    cfg: TrainConfig,
    registry: BackendRegistry,
    *,
    run_dir: RunDir | None = None,
    resume: Checkpoint | None = None,
    reporter: Reporter | None = None,
    data: PreparedData | None = None,
    extend_to: int | None = None,
) -> TrainResult:
    """Train cfg (backend and data already resolved) and return the result; Ctrl-C saves and returns.

    The first Ctrl-C stops at the next chunk boundary; a KeyboardInterrupt between chunks (a second Ctrl-C,
    or one raised by a reporter) also saves, while one inside a backend call keeps the last checkpoint,
    because the state in the middle of a chunk matches no step.

    extend_to (with resume): train on to this many steps in all, also past a finished run's end. The LR
    schedule is then re-spanned over the new total: step s after the checkpoint uses the rate it would have
    had in a run planned that long; the steps already run keep the rates they had.
    """
    if extend_to is not None:
        if resume is None:
            raise EemicrogptError("extend_to needs a run to resume (internal)")
        if not int(resume.state.step) < extend_to <= MAX_STEPS:
            raise ConfigError(f"--steps {extend_to:,} must be more than the {int(resume.state.step):,} steps this "
                              f"run has done (and at most {MAX_STEPS:,})")
    reporter = reporter or NullReporter()
    data = data or prepare_data(cfg, resume.vocab if resume is not None else None)
    shape = cfg.model_shape(data.vocab.size)
    entry = registry.select(cfg.backend, shape, cfg.batch, cfg.dtype, cfg.precision)
    auto = cfg.backend in ("", "auto")
    backend_note = (registry.fallback_note(entry, shape, cfg.batch, cfg.dtype) if auto else None) or ""
    with open_session(entry, shape, cfg.batch, cfg.dtype, cfg.threads) as opened:
        apply_optimizer(opened, cfg)
        session = CheckedSession(opened, shape, cfg.dtype, entry.name)  # every output checked before use
        adaptive = None
        if cfg.threads is None and entry.spec is not None and entry.spec.thread_independent and opened.threads > 1:
            # threads: auto. Any count trains the same bits here, so the count can follow the machine's load.
            adaptive = AdaptiveThreads(opened, auto_candidates(opened.threads))
        run = _Run(cfg, entry, session, data, shape, run_dir, resume, extend_to, adaptive)
        if run_dir is not None:
            try:
                run_dir.write_config(cfg)
                run_dir.keep_metrics_until(run.step)
            except OSError as e:
                raise StorageError(describe_os_error(e, "cannot write the run directory")) from None
        n_val = 0 if data.val is None else len(data.val)
        reporter.start(RunInfo(entry, cfg, run.step, run.total, len(data.train), n_val, data.n_truncated,
                               data.n_dropped, run_dir.path if run_dir else None, shape, data.vocab, data.note,
                               backend_note, data_unit=data.unit, data_hint=data.hint))
        interrupted, in_chunk, signum = False, False, None

        def note(first: int) -> None:
            reporter.message(f"{signal_name(first)}: stopping after this chunk (send it again to abort)")

        try:
            with deferred_stop(note) as stop:
                if run.tracks_best and not run.val_batches:
                    reporter.message("note: this split has no validation items, so keep_best and patience have "
                                     "nothing to compare")
                while run.step < run.total and not stop.requested and not run.at_target and not run.stopped_early:
                    in_chunk = True
                    run.chunk()
                    in_chunk = False
                    if run.thread_note is not None:
                        reporter.message(run.thread_note)
                        run.thread_note = None
                    if run.at_log_step():  # before the progress callback, so an interrupt there keeps the log
                        reporter.log(run.log())
                        if cfg.sample_every is not None and run.step % cfg.sample_every == 0:
                            reporter.message(run.sample())
                    if run.at_target and run.target is not None:
                        where = (f" (mean of the last {ROLLING} steps); stopped at step {run.step:,}, the end of that "
                                 "chunk") if cfg.target_metric == "train" else f"; stopped at step {run.step:,}"
                        reporter.message(run.target.describe() + where)
                    if run.stopped_early:
                        kept = f", kept in {run_dir.best_path}" if run_dir is not None and cfg.keep_best else ""
                        reporter.message(f"stopped early at step {run.step:,}: the validation loss has not improved "
                                         f"for {cfg.patience} validation rounds ({run.best.describe()}{kept})")
                    reporter.progress(run.step, run.total, run.train_loss)
                signum = stop.signum
                if run.step >= run.total and run.target is not None and not run.target.reached:
                    final = (f"final train loss {run.train_loss:.4f}, mean of the last {ROLLING} steps"
                             if cfg.target_metric == "train" else f"last validation loss {run.val_loss:.4f}")
                    reporter.message(f"{run.target.describe()} in {run.total:,} steps ({final})")
                if stop.requested and run.step < run.total and not run.at_target and not run.stopped_early:
                    interrupted = True
                    reporter.message(f"stopped at step {run.step}/{run.total}; {run.checkpoint()}")
        except BackendOutputError as e:
            raise BackendOutputError(f"{e}; {run.kept()}") from None
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
        return run.result(interrupted, signum)
