"""The sweep's terminal view: one line per finished run, and on a terminal a live bar with runs done,
running and failed, the ETA and the best so far (val loss, or time to target when the runs have a target)."""

from __future__ import annotations

import math
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from ..training.target import TargetOutcome
from .results import fmt, reached, target_metric
from .runner import DONE, FAILED, UNAVAILABLE


def eta_seconds(durations: list[float], remaining: int, running: int, slots: int) -> float | None:
    """Runs still to go at the mean duration so far, spread over the slots (None until a run has finished);
    a running run counts as half done."""
    if not durations:
        return None
    mean = sum(durations) / len(durations)
    return mean * (remaining + running / 2) / max(slots, 1)


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    value = round(value)
    return f"{value // 60}m{value % 60:02d}s" if value >= 60 else f"{value}s"


class SweepProgress:
    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self.total = self.done = self.failed = self.interrupted = self.unavailable = 0
        self.best: tuple[float, str] | None = None
        self.best_by_time = False  # a run reached a target: the best is the fastest of those
        self.durations: list[float] = []
        self.bar: Progress | None = None
        self.task: Any = None
        self.eta: float | None = None
        self.t0 = time.perf_counter()

    def _consider(self, record: dict[str, Any]) -> None:
        if reached(record):
            seconds = float(record["seconds_to_target"])
            if not self.best_by_time or self.best is None or seconds < self.best[0]:
                self.best, self.best_by_time = (seconds, record["run_id"]), True
            return
        val = record.get("val_loss")
        if not self.best_by_time and record.get("status") == DONE and isinstance(val, (int, float)) and \
                math.isfinite(val) and (self.best is None or val < self.best[0]):
            self.best = (float(val), record["run_id"])

    def best_text(self) -> str:
        if self.best is None:
            return "-"
        return f"{self.best[0]:.3f} s to target ({self.best[1]})" if self.best_by_time else \
            f"{self.best[0]:.4f} ({self.best[1]})"

    def begin(self, total: int, skipped: int, where: str, finished: list[dict[str, Any]],
              unavailable: int = 0) -> None:
        self.total, self.done, self.unavailable = total, skipped, unavailable
        for record in finished:
            self._consider(record)
        self.console.print(where, highlight=False)
        todo = total - skipped - unavailable
        also = f", {unavailable} unavailable here (skipped)" if unavailable else ""
        self.console.print(f"{total} runs: {skipped} already finished (skipped){also}, {todo} to run",
                           highlight=False)
        self.bar = Progress(
            TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
            console=self.console, disable=not self.console.is_terminal,
        )
        self.bar.start()
        self.task = self.bar.add_task("sweep", total=total, completed=skipped + unavailable, status="")

    def started(self, run_id: str) -> None:
        pass

    def status(self, running: int) -> str:
        return (f"done {self.done}, running {running}, failed {self.failed}, ETA {_seconds(self.eta)}, "
                f"best {self.best_text()}")

    def finished(self, record: dict[str, Any]) -> None:
        status = record.get("status")
        if status == DONE:
            self.done += 1
            self.durations.append(float(record.get("wall_s") or 0.0))
        elif status == FAILED:
            self.failed += 1
        elif status == UNAVAILABLE:
            self.unavailable += 1
        else:
            self.interrupted += 1
        self._consider(record)
        what = (f"val {fmt(record.get('val_loss'))}, train {fmt(record.get('train_loss'))}, "
                f"{record.get('steps', 0):,} steps in {record.get('wall_s', 0):.1f} s" if status == DONE
                else record.get("error", f"stopped at step {record.get('steps', '?')}"))
        if status == DONE and isinstance(record.get("target_loss"), (int, float)):
            what += "; " + TargetOutcome(float(record["target_loss"]), reached(record), record.get("steps_to_target"),
                                         record.get("seconds_to_target"), target_metric(record)).describe()
        finished = self.done + self.failed + self.interrupted + self.unavailable
        self.console.print(f"[{finished}/{self.total}] {record['run_id']}: {status}: {what}; best so far "
                           f"{self.best_text()}", highlight=False)
        if self.bar is not None:
            self.bar.update(self.task, completed=finished)

    def tick(self, running: int, pending: int, slots: int) -> None:
        self.eta = eta_seconds(self.durations, pending, running, slots)
        if self.bar is not None:
            self.bar.update(self.task, status=self.status(running))

    def note(self, text: str) -> None:
        self.console.print(text, highlight=False, soft_wrap=True)

    def end(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
        elapsed = time.perf_counter() - self.t0
        self.console.print(f"{self.status(0)}; {elapsed:.1f} s this invocation", highlight=False)
