"""A run directory: the resolved config, the metrics log and the checkpoint (and with keep_best the best one),
under fixed names."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ..base.atomic import atomic_write_text, remove_stale_temporaries
from ..base.errors import CheckpointError, EemicrogptError, StorageError, describe_os_error
from ..base.paths import user_path
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
# Created with the directory, so its presence marks the directory as an eemicrogpt run's (files there are ours
# to rewrite); held (flock) by the one process training in the directory, released when it exits.
LOCK_NAME = ".lock"
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
    (it lacks .lock); None when it is missing, empty or ours."""
    try:
        entries = sorted(p.name for p in directory.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return None  # nothing there to overwrite (creating it reports any problem with the path)
    except OSError as e:
        return describe_os_error(e, f"cannot list {option}")
    if not entries or LOCK_NAME in entries:
        return None
    shown = ", ".join(entries[:SHOWN_ENTRIES]) + (", ..." if len(entries) > SHOWN_ENTRIES else "")
    return (f"{option} {directory} is not empty and was not made by eemicrogpt (it holds {shown}); choose a new "
            "or empty directory (eemicrogpt never writes among files it did not create)")


def _mkdir(path: Path, exist_ok: bool) -> None:
    try:
        path.mkdir(parents=True, exist_ok=exist_ok)
    except FileExistsError:
        if exist_ok:  # a file where the directory should be
            raise CheckpointError(f"--out {path} exists and is not a directory; choose another --out") from None
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
    def create(cls, out: str | None, cfg: TrainConfig) -> RunDir:
        """A new run directory; refuses one that already holds a run (that is what --resume is for)."""
        path = user_path(out, "--out") if out else _fresh_default(cfg)
        run = cls(path)
        if run.checkpoint_path.exists():
            raise CheckpointError(f"{path} already holds a run; continue it with --resume {path} or pick another --out")
        if path.exists() and not path.is_dir():
            raise CheckpointError(f"--out {path} exists and is not a directory; choose another --out")
        problem = foreign_directory_problem(path, "--out")
        if problem is not None:
            raise CheckpointError(problem)
        _mkdir(path, exist_ok=True)
        run.mark()
        return run

    def mark(self) -> None:
        """Mark the directory as an eemicrogpt run's (see LOCK_NAME)."""
        try:
            os.close(os.open(self.path / LOCK_NAME, os.O_WRONLY | os.O_CREAT, 0o644))
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
        if not run.path.is_dir():
            raise CheckpointError(f"run directory not found: {run.path}")
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
        try:
            with self.metrics_path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as e:
            if e.filename is None:  # a failed write() names no file: name the one the user knows
                raise OSError(e.errno, e.strerror, str(self.metrics_path)) from e
            raise

    def read_metrics(self) -> list[dict[str, Any]]:
        """The records; a damaged line (half-written by a full disk or a power cut) is skipped, not fatal."""
        if not self.metrics_path.exists():
            return []
        records = []
        for line in self.metrics_path.read_bytes().decode("utf-8", "replace").splitlines():
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
