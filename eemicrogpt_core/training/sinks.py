"""Where else a run's metrics go (`log_to`): TensorBoard event files and W&B, beside metrics.jsonl, which stays
the record every command reads. Each sink is an optional extra, imported only when asked for; a missing one is
refused before the run directory is created."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from ..base.errors import ConfigError
from .config import TrainConfig, sink_names
from .trainer import Reporter, RunInfo

_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb"}
# The scalars every sink receives, by the name they get there (metrics.jsonl keeps its own names).
SCALARS = {"train_loss": "loss/train", "val_loss": "loss/val", "lr": "lr", "us_per_step": "us_per_step"}


def check_installed(cfg: TrainConfig) -> None:
    """A sink asked for whose package is missing: one line naming the pip command."""
    for name in sink_names(cfg.log_to):
        if importlib.util.find_spec(_MODULES[name]) is None:
            raise ConfigError(f"--log-to {name} needs the {name} package: pip install 'eemicrogpt[{name}]'")


def scalars_of(record: dict[str, Any]) -> dict[str, float]:
    return {tag: float(record[key]) for key, tag in SCALARS.items() if isinstance(record.get(key), (int, float))}


class Sink(Protocol):
    def start(self, info: RunInfo) -> None: ...
    def scalars(self, step: int, values: dict[str, float]) -> None: ...
    def samples(self, step: int, names: Sequence[str]) -> None: ...
    def close(self) -> None: ...


def open_sinks(cfg: TrainConfig, run_dir: Path) -> list[Sink]:
    sinks: list[Sink] = []
    for name in sink_names(cfg.log_to):
        if name == "tensorboard":
            from .sink_tensorboard import TensorBoardSink

            sinks.append(TensorBoardSink(run_dir))
        else:
            from .sink_wandb import WandbSink

            sinks.append(WandbSink(run_dir))
    return sinks


class SinkReporter:
    """A reporter that also hands the run's start and every metrics record to the sinks."""

    def __init__(self, inner: Reporter, sinks: Sequence[Sink]) -> None:
        self.inner, self.sinks = inner, sinks

    def start(self, info: RunInfo) -> None:
        for sink in self.sinks:
            sink.start(info)
        self.inner.start(info)

    def progress(self, step: int, total: int, train_loss: float) -> None:
        self.inner.progress(step, total, train_loss)

    def log(self, record: dict[str, Any]) -> None:
        values = scalars_of(record)
        for sink in self.sinks:
            sink.scalars(int(record["step"]), values)
        self.inner.log(record)

    def message(self, text: str) -> None:
        self.inner.message(text)

    def finish(self) -> None:
        self.inner.finish()
