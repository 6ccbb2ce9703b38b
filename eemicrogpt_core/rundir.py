"""A run directory: the resolved config, the metrics log and the checkpoint, under fixed names."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from .atomic import atomic_write_text
from .config import TrainConfig, dump_yaml
from .errors import CheckpointError, StorageError, describe_os_error
from .paths import user_path

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; two runs in one directory are then not detected
    fcntl = None  # type: ignore[assignment]

CONFIG_NAME = "config.yaml"
METRICS_NAME = "metrics.jsonl"
CHECKPOINT_NAME = "checkpoint.npz"
LOCK_NAME = ".lock"  # held (flock) by the one process training in the directory; released when it exits


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

    @classmethod
    def create(cls, out: str | None, cfg: TrainConfig) -> RunDir:
        """A new run directory; refuses one that already holds a run (that is what --resume is for)."""
        path = user_path(out, "--out") if out else _fresh_default(cfg)
        run = cls(path)
        if run.checkpoint_path.exists():
            raise CheckpointError(f"{path} already holds a run; continue it with --resume {path} or pick another --out")
        if path.exists() and not path.is_dir():
            raise CheckpointError(f"--out {path} exists and is not a directory; choose another --out")
        _mkdir(path, exist_ok=True)
        return run

    def claim(self) -> None:
        """Take the directory for this process: a second run (or resume) of it fails until this one exits."""
        if fcntl is None or self._lock_fd is not None:
            return
        try:
            fd = os.open(self.path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise StorageError(describe_os_error(e, "cannot write in the run directory")) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise CheckpointError(f"{self.path} is in use by another eemicrogpt run; wait for it to finish or "
                                  "choose another --out") from None
        self._lock_fd = fd

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

    def write_config(self, cfg: TrainConfig) -> None:
        atomic_write_text(self.config_path, dump_yaml(cfg))

    def append_metric(self, record: dict[str, Any]) -> None:
        with self.metrics_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

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
