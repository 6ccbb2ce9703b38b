"""Runs a sweep: checks everything up front, lays out the sweep directory, feeds an executor, records results.

Sweep directory:
    spec.yaml        the resolved spec; a re-run may change the grid and the seeds (runs already finished keep
                     their results, new ones run), while a different base, name or random section is refused
    results.jsonl    one record per finished, failed or interrupted run (the last record of a run wins)
    results.csv      the latest record of every run, sorted by val loss
    runs/<run id>/   ordinary run directories (config.yaml, metrics.jsonl, checkpoint.npz)
    .lock            held (flock) by the sweep running in the directory: a second one is refused meanwhile
Re-running skips finished runs, resumes interrupted ones from their checkpoints and retries failed ones; a run
recorded as finished whose run directory lost its checkpoint runs again (one whose checkpoint is finished is
only reported, not retrained).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from ..backends.registry import BackendRegistry
from ..base.atomic import atomic_write_text, remove_stale_temporaries
from ..base.errors import ConfigError, StorageError, describe_os_error
from ..base.reading import read_regular_bytes
from ..data.datafile import resolve_data_path
from ..data.names import read_names
from ..data.text import read_text
from ..model.shape import NAMES_VOCAB
from ..training.config import MAX_CONFIG_BYTES, resolve_backend
from ..training.interrupt import StopFlag, stop_signals_raise_interrupt
from ..training.rundir import CHECKPOINT_NAME, LOCK_NAME, lock_directory
from .progress import SweepProgress
from .results import CSV_NAME, ResultStore
from .runner import DONE, FAILED, INTERRUPTED, UNAVAILABLE, base_record, unavailable_reason
from .spec import Run, SweepSpec, expand

SPEC_NAME = "spec.yaml"
RUNS_DIR = "runs"


class Executor(Protocol):
    name: str

    @property
    def slots(self) -> int: ...
    def describe(self) -> str: ...
    def start(self) -> None: ...
    def free(self) -> int: ...
    def running(self) -> int: ...
    def submit(self, task: dict[str, Any]) -> None: ...
    def wait(self, timeout: float) -> list[dict[str, Any]]: ...
    def interrupt(self, signum: int = signal.SIGINT) -> None: ...
    def close(self) -> None: ...


@dataclass
class SweepOutcome:
    sweep_dir: Path
    rows: list[dict[str, Any]]  # this spec's runs, latest record each, sorted as results.sort_key does
    skipped: int  # finished before this invocation (unavailable runs are in rows, with their reason)
    interrupted: bool
    stop_signal: int | None = None  # the signal that stopped the sweep (SIGINT, SIGTERM, SIGHUP), if one did

    @property
    def failed(self) -> int:
        return sum(r.get("status") == FAILED for r in self.rows)


def prepare_runs(spec: SweepSpec, backend: str | None, data: str | None) -> list[Run]:
    """Expand the spec and resolve backend and names file for every run (the file is read once here, so a
    missing or malformed one fails before anything starts)."""
    runs = expand(spec)
    data_paths: dict[tuple[str | None, str], str] = {}
    resolved = []
    for run in runs:
        cfg = run.config
        where = (cfg.data, cfg.data_format)
        if where not in data_paths:
            path = resolve_data_path(data, cfg.data, data_format=cfg.data_format)
            if cfg.data_format == "text":
                read_text(path, lowercase=cfg.lowercase)
            else:
                read_names(path, drop_invalid=cfg.drop_invalid)
            data_paths[where] = str(path)
        cfg = dataclasses.replace(cfg, backend=resolve_backend(backend, cfg.backend), data=data_paths[where])
        resolved.append(dataclasses.replace(run, config=cfg))
    return resolved


def check_backends(runs: list[Run], registry: BackendRegistry) -> dict[str, str]:
    """The runs `auto` finds no backend for here (say a bf16 cell on a CPU without bf16 kernels), by run id
    with the reason: the sweep skips them. A named backend that cannot run its shape raises the registry's
    one-line error, and so does a sweep of which no run can run here."""
    reasons: dict[tuple[Any, ...], str | None] = {}
    unavailable = {}
    for run in runs:
        cfg = run.config
        key = (cfg.backend, cfg.d_model, cfg.n_heads, cfg.batch, cfg.dtype, cfg.precision)
        if key not in reasons:
            reasons[key] = unavailable_reason(cfg, registry)
            if reasons[key] is None:
                registry.select(cfg.backend, cfg.model_shape(NAMES_VOCAB), cfg.batch, cfg.dtype, cfg.precision)
        reason = reasons[key]
        if reason is not None:
            unavailable[run.run_id] = reason
    if runs and len(unavailable) == len(runs):
        raise ConfigError(f"no run of this sweep can run here: {next(iter(unavailable.values()))}")
    return unavailable


def skipped_note(runs: list[Run], unavailable: dict[str, str]) -> list[str]:
    """One line per precision of the runs skipped as unavailable: how many, and the first one's reason."""
    by_precision: dict[str, list[Run]] = {}
    for run in runs:
        if run.run_id in unavailable:
            by_precision.setdefault(run.config.precision or "fp32", []).append(run)
    return [f"skipped {len(group)} run{'s' * (len(group) != 1)} of precision {precision}, unavailable here "
            f"(e.g. {group[0].run_id}: {unavailable[group[0].run_id]})" for precision, group in by_precision.items()]


REGROWABLE = ("grid", "seeds")  # what a re-run may change: a run's id names its varied values, so a run
# that keeps its id under the same base has the same configuration and its finished result stands


def spec_conflict(saved: Any, new: dict[str, Any]) -> str | None:
    """Why runs of the saved spec cannot be reused under the new one (None: only the grid or seeds differ)."""
    if not isinstance(saved, dict):
        return "the saved spec is not a mapping"
    problems = []
    for key in dict.fromkeys([*saved, *new]):
        if key in REGROWABLE or saved.get(key) == new.get(key):
            continue
        if key == "base" and isinstance(saved.get(key), dict) and isinstance(new.get(key), dict):
            old, now = saved[key], new[key]
            problems += [f"base {k}: {old.get(k, '(unset)')!r} -> {now.get(k, '(unset)')!r}"
                         for k in dict.fromkeys([*old, *now]) if old.get(k) != now.get(k)]
        else:
            problems.append(f"{key}: {saved.get(key, '(unset)')!r} -> {new.get(key, '(unset)')!r}")
    return "; ".join(problems) or None


def open_sweep_dir(sweep_dir: Path, spec: SweepSpec) -> str | None:
    """Create the directory with spec.yaml, or check an existing one against the spec. A spec that differs
    only in its grid or seeds replaces the saved one (what is said about it is returned); any other
    difference is refused, naming it."""
    text = yaml.safe_dump(spec.resolved(), sort_keys=False)
    path = sweep_dir / SPEC_NAME
    if path.is_file():
        try:
            saved = yaml.safe_load(read_regular_bytes(path, "sweep's spec", MAX_CONFIG_BYTES, ConfigError))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            reason = " ".join(str(e).split())
            raise ConfigError(f"{path} is damaged ({reason}); restore it, or move that directory away to start the "
                              "sweep afresh") from None
        new = yaml.safe_load(text)
        if saved == new:
            return None
        conflict = spec_conflict(saved, new)
        if conflict is not None:
            raise ConfigError(f"{sweep_dir} holds a sweep made from a different spec ({path}): {conflict}; its runs "
                              "would not be this spec's: pick another --out or remove that directory")
        atomic_write_text(path, text)
        changed = " and ".join(key for key in REGROWABLE if saved.get(key) != new.get(key))
        return (f"the {changed} changed since the last run into {sweep_dir}: finished runs the spec still has keep "
                "their results, the new ones run")
    if not_a_sweep_dir(sweep_dir):
        raise ConfigError(f"--out {sweep_dir} exists and is not a sweep directory (no {SPEC_NAME})")
    atomic_write_text(path, text)
    return None


def not_a_sweep_dir(sweep_dir: Path) -> bool:
    """It holds files but no spec.yaml (a .lock alone is what a sweep killed before writing its spec leaves)."""
    if (sweep_dir / SPEC_NAME).is_file() or not sweep_dir.exists():
        return False
    return not sweep_dir.is_dir() or any(p.name != LOCK_NAME for p in sweep_dir.iterdir())


def claim_sweep_dir(sweep_dir: Path, spec: SweepSpec) -> tuple[int | None, str | None]:
    """Create or check the sweep directory and hold its lock: a second sweep into it is refused until this one
    exits (two would each record the other's runs as failed). Returns the descriptor holding the lock and
    open_sweep_dir's note. A refusal leaves nothing behind: the lock file and the directory are removed if this
    call made them."""
    if not_a_sweep_dir(sweep_dir):
        raise ConfigError(f"--out {sweep_dir} exists and is not a sweep directory (no {SPEC_NAME})")
    made_dir = not sweep_dir.exists()
    made_lock = not (sweep_dir / LOCK_NAME).exists()
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StorageError(describe_os_error(e, "cannot create the sweep directory")) from None
    fd = None
    try:
        fd = lock_directory(sweep_dir, f"{sweep_dir} is in use by another eemicrogpt sweep; wait for it to finish "
                                       "or choose another --out", ConfigError)
        note = open_sweep_dir(sweep_dir, spec)
    except BaseException:
        if fd is not None:
            os.close(fd)
        if made_lock and fd is not None:
            (sweep_dir / LOCK_NAME).unlink(missing_ok=True)
        if made_dir:
            with contextlib.suppress(OSError):
                sweep_dir.rmdir()
        raise
    if fd is not None:
        remove_stale_temporaries(sweep_dir, (SPEC_NAME, CSV_NAME))
    return fd, note


def recorded_done(store: ResultStore, sweep_dir: Path, run_id: str) -> bool:
    """results.jsonl says done, with its numbers, and the run's checkpoint is still there. Anything else runs
    again: the runner reports a finished checkpoint without retraining, and resumes or restarts the rest."""
    record = store.latest.get(run_id, {})
    return (record.get("status") == DONE and isinstance(record.get("val_loss"), (int, float))
            and (sweep_dir / RUNS_DIR / run_id / CHECKPOINT_NAME).is_file())


def make_task(run: Run, sweep_dir: Path) -> dict[str, Any]:
    run_dir = sweep_dir / RUNS_DIR / run.run_id
    config = dataclasses.replace(run.config, out=str(run_dir)).to_dict()
    return {"run_id": run.run_id, "varied": run.varied, "config": config, "run_dir": str(run_dir)}


def run_sweep(spec: SweepSpec, runs: list[Run], sweep_dir: Path, executor: Executor,
              progress: SweepProgress, unavailable: dict[str, str] | None = None) -> SweepOutcome:
    """Run every unfinished run but the unavailable ones (recorded with their reason, see check_backends);
    Ctrl-C stops them at a chunk boundary with a checkpoint each."""
    lock, note = claim_sweep_dir(sweep_dir, spec)
    if note is not None:
        progress.note(note)
    try:
        with stop_signals_raise_interrupt() as stop:
            outcome = _run_claimed(spec, runs, sweep_dir, executor, progress, unavailable or {}, stop)
        return dataclasses.replace(outcome, stop_signal=stop.signum)
    finally:
        if lock is not None:
            os.close(lock)


def _run_claimed(spec: SweepSpec, runs: list[Run], sweep_dir: Path, executor: Executor,
                 progress: SweepProgress, unavailable: dict[str, str], stop: StopFlag) -> SweepOutcome:
    store = ResultStore(sweep_dir, spec.varied_keys)
    done = {r.run_id for r in runs if recorded_done(store, sweep_dir, r.run_id)}
    todo = [r for r in runs if r.run_id not in done and r.run_id not in unavailable]
    skipped = len(runs) - len(todo) - len(unavailable.keys() - done)
    pending = deque(make_task(r, sweep_dir) for r in todo)
    progress.begin(len(runs), skipped, executor.describe(), [store.latest[r.run_id] for r in runs
                                                             if r.run_id in done], len(runs) - skipped - len(todo))
    for run in runs:
        if run.run_id in unavailable and run.run_id not in done:
            store.add({**base_record(run.run_id, run.config.to_dict(), run.varied), "status": UNAVAILABLE,
                       "error": unavailable[run.run_id]})
    for line in skipped_note([r for r in runs if r.run_id not in done], unavailable):
        progress.note(line)
    interrupted = False
    executor.start()
    try:
        while pending or executor.running():
            try:
                while pending and executor.free():
                    task = pending.popleft()
                    executor.submit(task)
                    progress.started(task["run_id"])
                for record in executor.wait(0.2):
                    store.add(record)
                    progress.finished(record)
                if pending and not executor.free() and not executor.running():
                    raise ConfigError(f"every {executor.name} worker exited; {len(pending)} runs not started")
                progress.tick(executor.running(), len(pending), executor.slots)
            except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP (stop_signals_raise_interrupt)
                if not interrupted:
                    progress.note("stopping: running runs stop at their next chunk and save a checkpoint "
                                  "(a second Ctrl-C or signal aborts at once; each run keeps its last checkpoint)")
                interrupted = True
                pending.clear()
                executor.interrupt(stop.last or signal.SIGINT)  # the workers get the signal the driver got
    finally:
        executor.close()
        progress.end()
    rows = store.rows([r.run_id for r in runs])
    interrupted = interrupted or any(r.get("status") == INTERRUPTED for r in rows)
    return SweepOutcome(sweep_dir, rows, skipped, interrupted)

