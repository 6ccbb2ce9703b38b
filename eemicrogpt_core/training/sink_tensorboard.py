"""`log_to: tensorboard`: event files in RUN/tensorboard/ (`tensorboard --logdir RUN`), written with the
tensorboard package's own event writer and summary protos, so no TensorFlow or PyTorch is needed."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .trainer import RunInfo

SUBDIR = "tensorboard"


class TensorBoardSink:
    def __init__(self, run_dir: Path) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.text.summary_v2 import text_pb
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary, self._text = event_pb2.Event, summary_pb2.Summary, text_pb
        # Each invocation (a resume too) adds its own event file; TensorBoard reads them as one run.
        self.writer = EventFileWriter(str(run_dir / SUBDIR), flush_secs=10)

    def _write(self, step: int, summary: object) -> None:
        self.writer.add_event(self._event(wall_time=time.time(), step=step, summary=summary))

    def start(self, info: RunInfo) -> None:
        text = f"{info.shape.describe()} on {info.backend.name}; steps {info.start_step:,} to {info.total_steps:,}"
        self._write(info.start_step, self._text("run", np.array(text)))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self._write(step, self._summary(value=[self._summary.Value(tag=tag, simple_value=value)
                                               for tag, value in values.items()]))

    def samples(self, step: int, names: Sequence[str]) -> None:
        self._write(step, self._text("samples", np.array(", ".join(names))))

    def close(self) -> None:
        self.writer.close()
