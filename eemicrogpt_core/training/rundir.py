"""A run directory: the resolved config, the metrics log and the checkpoint (and with keep_best the best one),
under fixed names."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from ..base.atomic import append_text, atomic_write_text, remove_stale_temporaries
from ..base.errors import CheckpointError, EemicrogptError, StorageError, describe_os_error
from ..base.ownership import made_by_eemicrogpt, mark_directory, marker_name
from ..base.paths import resolved_dir, user_path
from ..base.reading import file_kind, read_regular_bytes
from .config import TrainConfig, dump_yaml

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; two runs in one directory are then not detected
    fcntl = None  # type: ignore[assignment]

CONFIG_NAME = "config.yaml"
METRICS_NAME = "metrics.jsonl"
CHECKPOINT_NAME = "checkpoint.npz"
BEST_NAME = "best.npz"  # keep_best: the checkpoint of the lowest validation loss so far
RUN_FILES = (CONFIG_NAME, METRICS_NAME, CHECKPOINT_NAME, BEST_NAME)
# Held (flock) by the one process training in the directory, released when it exits. Earlier versions also
# took its mere presence as "this directory is ours", which anyone could forge with `touch .lock`.
LOCK_NAME = ".lock"
# What marks a directory as a run's (see base/ownership.py); a bare .lock no longer does. Earlier versions'
# run directories (a .lock beside the run files) still resume, since --resume needs only a readable
# checkpoint.npz; a new run into one that never saved a checkpoint is refused like any directory of the user's.
RUN_KIND = "run"
MARKER_NAME = marker_name(RUN_KIND)
# metrics.jsonl holds a record of ~200 bytes per log step: 64 MiB is some 300,000 log lines (log_every 100 over
# 30 million steps), and parsed they stay under a few hundred MB. A bigger or endless file (a link to
# /dev/zero) is refused after reading at most this much.
MAX_METRICS_BYTES = 64 << 20
SHOWN_ENTRIES = 3  # of a foreign directory's files, named in the refusal


def lock_directory(directory: Path, busy: str, error: type[EemicrogptError] = CheckpointError) -> int | None:
    """flock directory/.lock without waiting; returns the descriptor that holds it (None where there are no
    advisory locks). Raises error(busy) when another process holds it."""
    if fcntl is None:
        return None
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise StorageError(describe_os_error(e, f"cannot write in {directory}")) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise error(busy) from None
    return fd


def foreign_directory_problem(directory: Path, option: str) -> str | None:
    """Why eemicrogpt must not write in `directory`: it exists, is not empty and was not made by eemicrogpt
    (it lacks a valid MARKER_NAME); None when it is missing, empty or ours."""
    try:
        entries = sorted(p.name for p in directory.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return None  # nothing there to overwrite (creating it reports any problem with the path)
    except OSError as e:
        return describe_os_error(e, f"cannot list {option}")
    if not entries or made_by_eemicrogpt(directory, RUN_KIND):
        return None
    shown = ", ".join(entries[:SHOWN_ENTRIES]) + (", ..." if len(entries) > SHOWN_ENTRIES else "")
    return (f"{option} {directory} is not empty and was not made by eemicrogpt (it holds {shown}); choose a new "
            "or empty directory (eemicrogpt never writes among files it did not create)")


def _mkdir(path: Path, exist_ok: bool, option: str = "--out") -> None:
    try:
        path.mkdir(parents=True, exist_ok=exist_ok)
    except FileExistsError:
        if exist_ok:  # a file where the directory should be
            raise CheckpointError(f"{option} {path} exists and is not a directory; choose another {option}") from None
        raise
    except OSError as e:
        raise StorageError(describe_os_error(e, "cannot create the run directory")) from None


def _fresh_default(cfg: TrainConfig) -> Path:
    """runs/<time>-d<size>, created exclusively (mkdir fails if it exists), so that two runs started in the
    same second get different directories: the loser of the race takes the next numeric suffix."""
    base = Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-d{cfg.d_model}"
    for n in range(1, 10_000):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            _mkdir(path, exist_ok=False)
            return path
        except FileExistsError:
            continue
    raise CheckpointError(f"{base}: too many runs started this second; pass --out")


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock_fd: int | None = None

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_NAME

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_NAME

    @property
    def checkpoint_path(self) -> Path:
        return self.path / CHECKPOINT_NAME

    @property
    def best_path(self) -> Path:
        return self.path / BEST_NAME

    @classmethod
    def create(cls, out: str | None, cfg: TrainConfig, option: str = "--out") -> RunDir:
        """A new run directory; refuses one that already holds a run (that is what --resume is for) and one
        with files eemicrogpt did not make. Ownership is decided on where the path leads (resolved_dir) before
        anything is created, and a creation that fails removes the directory it made. option names `out` in
        errors (the API's keyword is not the command line's flag)."""
        if not out:
            run = cls(_fresh_default(cfg))
            run._mark_or_remove(made=True)
            return run
        path = resolved_dir(user_path(out, option))
        run = cls(path)
        if run.checkpoint_path.exists():
            raise CheckpointError(f"{path} already holds a run; continue it with --resume {path} or pick another "
                                  f"{option}")
        if path.exists() and not path.is_dir():
            raise CheckpointError(f"{option} {path} exists and is not a directory; choose another {option}")
        problem = foreign_directory_problem(path, option)
        if problem is not None:
            raise CheckpointError(problem)
        made = not path.exists()
        _mkdir(path, exist_ok=True, option=option)
        run._mark_or_remove(made)
        return run

    def _mark_or_remove(self, made: bool) -> None:
        try:
            self.mark()
        except BaseException:
            if made:
                with contextlib.suppress(OSError):  # it holds something after all: leave it
                    self.path.rmdir()
            raise

    def mark(self) -> None:
        """Mark the directory as an eemicrogpt run's (see MARKER_NAME)."""
        try:
            mark_directory(self.path, RUN_KIND)
        except OSError as e:
            raise StorageError(describe_os_error(e, "cannot write in the run directory")) from None

    def claim(self) -> None:
        """Take the directory for this process: a second run (or resume) of it fails until this one exits.
        Holding it, remove the temporary files a killed predecessor's atomic writes left behind."""
        if self._lock_fd is not None:
            return
        self._lock_fd = lock_directory(self.path, f"{self.path} is in use by another eemicrogpt run; wait for it "
                                                  "to finish or choose another --out")
        if self._lock_fd is not None:
            remove_stale_temporaries(self.path, RUN_FILES)

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    @classmethod
    def existing(cls, path: str | Path) -> RunDir:
        run = cls(user_path(path, "run directory"))
        if run.path.exists() and not run.path.is_dir():
            hint = f"; pass its directory, {run.path.parent}" if run.path.name == CHECKPOINT_NAME else ""
            raise CheckpointError(f"{run.path} is a file, not a run directory (the directory eemicrogpt train wrote, "
                                  f"holding {CHECKPOINT_NAME}){hint}")
        if not run.path.is_dir():
            raise CheckpointError(f"run directory not found: {run.path}")
        if run.checkpoint_path.exists() and not run.checkpoint_path.is_file():  # say a link to /dev/zero
            raise CheckpointError(f"{run.checkpoint_path}: the checkpoint is "
                                  f"{file_kind(run.checkpoint_path.stat().st_mode)}, not the file eemicrogpt saves")
        if not run.checkpoint_path.is_file():
            raise CheckpointError(f"{run.path} has no {CHECKPOINT_NAME}: not a run directory (or it never saved)")
        return run

    def model_file(self, best: bool = False) -> Path:
        """The checkpoint a command reads the model from: the last one, or with best the one of the lowest
        validation loss (what `sample`, `export`, `eval` and load() take with --best / best=True)."""
        if not best:
            return self.checkpoint_path
        if not self.best_path.is_file():
            raise CheckpointError(f"{self.path} has no {BEST_NAME}: the run was trained without keep_best (train "
                                  "with --keep-best to keep the checkpoint of the lowest validation loss)")
        return self.best_path

    def write_config(self, cfg: TrainConfig) -> None:
        atomic_write_text(self.config_path, dump_yaml(cfg))

    def append_metric(self, record: dict[str, Any]) -> None:
        append_text(self.metrics_path, json.dumps(record) + "\n")

    def metrics_text(self) -> str:
        """metrics.jsonl, read with a bound (MAX_METRICS_BYTES) and only if it is a regular file;
        FileNotFoundError when there is none."""
        raw = read_regular_bytes(self.metrics_path, "metrics log", MAX_METRICS_BYTES, CheckpointError)
        return raw.decode("utf-8", "replace")

    def read_metrics(self) -> list[dict[str, Any]]:
        """The records; a damaged line (half-written by a full disk or a power cut) is skipped, not fatal."""
        try:
            text = self.metrics_text()
        except FileNotFoundError:
            return []
        records = []
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                records.append(record)
        return records

    def keep_metrics_until(self, step: int) -> None:
        """Drop records past the checkpoint, so a resumed run does not log those steps twice."""
        kept = [r for r in self.read_metrics() if r["step"] <= step]
        atomic_write_text(self.metrics_path, "".join(json.dumps(r) + "\n" for r in kept))


def model_file(run_dir: str | Path, best: bool = False) -> Path:
    """The checkpoint to read a run's model from: RunDir.existing(run_dir).model_file(best)."""
    return RunDir.existing(run_dir).model_file(best)
