"""`log_to: wandb`: a W&B run in RUN/wandb/. Offline unless $WANDB_MODE says otherwise, since a training run
must not wait on a network it may not have; `wandb sync RUN/wandb/offline-run-*` uploads it later. The
project is $WANDB_PROJECT (default eemicrogpt); each invocation of a run (a resume too) is one W&B run,
named after the run directory and grouped by it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .trainer import RunInfo

DEFAULT_PROJECT = "eemicrogpt"


class WandbSink:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.run: Any = None

    def start(self, info: RunInfo) -> None:
        import wandb

        name = self.run_dir.resolve().name
        mode: Any = os.environ.get("WANDB_MODE", "offline")  # wandb checks the value itself
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", DEFAULT_PROJECT), dir=str(self.run_dir),
                              mode=mode, name=name, group=name,
                              config=info.cfg.to_dict(), settings=wandb.Settings(console="off", silent=True))
        self.run.summary["backend"] = info.backend.name

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if self.run is not None:
            self.run.log(values, step=step)

    def samples(self, step: int, names: Sequence[str]) -> None:
        if self.run is not None:
            self.run.summary["samples"] = ", ".join(names)

    def close(self) -> None:
        if self.run is not None:
            import wandb

            self.run.finish()
            self.run = None
            # finish() returns before W&B's service process has flushed the run file; teardown waits for it,
            # so the run directory is complete when training returns.
            wandb.teardown()
