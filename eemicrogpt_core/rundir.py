"""A run directory: the resolved config, the metrics log and the checkpoint, under fixed names."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from .atomic import atomic_write_text
from .config import TrainConfig, dump_yaml
from .errors import CheckpointError

CONFIG_NAME = "config.yaml"
METRICS_NAME = "metrics.jsonl"
CHECKPOINT_NAME = "checkpoint.npz"


def _fresh_default(cfg: TrainConfig) -> Path:
    """runs/<time>-d<size>, with a numeric suffix when two runs start within the same second."""
    base = Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-d{cfg.d_model}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

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
        path = Path(out) if out else _fresh_default(cfg)
        run = cls(path)
        if run.checkpoint_path.exists():
            raise CheckpointError(f"{path} already holds a run; continue it with --resume {path} or pick another --out")
        if path.exists() and not path.is_dir():
            raise CheckpointError(f"--out {path} exists and is not a directory")
        path.mkdir(parents=True, exist_ok=True)
        return run

    @classmethod
    def existing(cls, path: str | Path) -> RunDir:
        run = cls(Path(path))
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
        if not self.metrics_path.exists():
            return []
        lines = self.metrics_path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def keep_metrics_until(self, step: int) -> None:
        """Drop records past the checkpoint, so a resumed run does not log those steps twice."""
        kept = [r for r in self.read_metrics() if int(r.get("step", 0)) <= step]
        atomic_write_text(self.metrics_path, "".join(json.dumps(r) + "\n" for r in kept))
