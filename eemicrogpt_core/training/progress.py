"""The terminal view of a training run: a rich progress bar (steps/s, loss, ETA) plus one line per log step."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from .limits import describe_estimate
from .trainer import RunInfo


def describe_run(info: RunInfo) -> str:
    cfg, be = info.cfg, info.backend
    version = f" {be.version}" if be.version else ""
    what = f"resuming at step {info.start_step:,} of" if info.start_step else "training for"
    budget = f" (fit to a {cfg.time_budget:g} s budget)" if cfg.time_budget and not info.start_step else ""
    lines = [
        f"backend {be.name} ({be.distribution}{version}); {info.shape.describe()}, "
        f"{info.shape.n_params:,} params, batch {cfg.batch}, lr {cfg.lr:g}, seed {cfg.seed}",
        f"{what} {info.total_steps:,} steps{budget}",
        f"data {cfg.data}: {info.n_train:,} train / {info.n_val:,} validation {info.data_unit}"
        + (f", {info.n_truncated} longer than the context ({info.shape.context}) truncated" if info.n_truncated
           else "")
        + (f", {info.n_dropped} lines dropped" if info.n_dropped else ""),
        f"vocabulary {info.vocab.describe()}",
        describe_estimate(cfg, info.vocab.size, block_rows=be.block_rows, block_bytes=be.block_bytes),
    ]
    changes = cfg.optimizer_changes()
    if changes:
        lines.append(f"optimiser: {', '.join(changes)} (the other optimiser keys at their defaults)")
    warning = budget_warmup_warning(info)
    if warning:
        lines.append(warning)
    if info.data_note:
        lines.append(f"{'split' if info.data_unit == 'characters' else 'note'}: {info.data_note}")
    if info.data_hint:
        lines.append(f"hint: {info.data_hint}")
    if info.backend_note:
        lines.append(f"note: {info.backend_note}")
    if info.run_dir is not None:
        lines.append(f"run directory {info.run_dir}")
    return "\n".join(lines)


def budget_warmup_warning(info: RunInfo) -> str:
    """A fresh time-budget run sized to no more steps than its warm-up: the rate would ramp all run and never
    decay (with a fixed step count the config refuses this; a budget's step count is known only now)."""
    cfg = info.cfg
    if not cfg.time_budget or info.start_step or cfg.warmup_steps < info.total_steps:
        return ""
    return (f"warning: the {cfg.time_budget:g} s budget fits about {info.total_steps:,} steps, no more than "
            f"warmup_steps ({cfg.warmup_steps:,}): the learning rate ramps up for the whole run and never decays; "
            "lower warmup_steps or raise time_budget")


@contextlib.contextmanager
def batch_progress(label: str, console: Console | None = None) -> Iterator[Callable[[int, int], None]]:
    """A bar over a long job's batches (`eval` of a whole text), drawn on a terminal only, on stderr (stdout keeps
    the result), removed when done: yields on_batch(done, total)."""
    console = console or Console(stderr=True)
    bar = Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TextColumn("ETA"),
                   TimeRemainingColumn(), console=console, transient=True, disable=not console.is_terminal)
    task = bar.add_task(label, total=None)

    def on_batch(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    with bar:
        yield on_batch


def rate_text(steps_per_s: float) -> str:
    """Steps per second, or seconds per step when a step takes longer than one (a d384 step takes seconds)."""
    if steps_per_s >= 10:
        return f"{steps_per_s:,.0f} steps/s"
    if steps_per_s >= 1:
        return f"{steps_per_s:.1f} steps/s"
    return f"{1 / steps_per_s:.2f} s/step" if steps_per_s > 0 else ""


def format_record(record: dict[str, Any], total: int) -> str:
    val = record.get("val_loss")
    val_text = f"{val:.4f}" if val is not None else "-"
    return (
        f"step {record['step']:>{len(str(total))}}/{total}  train {record['train_loss']:.4f}  "
        f"val {val_text}  lr {record['lr']:.2e}  {record['us_per_step']:,.1f} us/step"
    )


class RichReporter:
    """Implements trainer.Reporter; the bar is drawn only on a terminal, the log lines always."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self._bar: Progress | None = None
        self.task: Any = None
        self.total = 0
        self.start_step = 0
        self.t0 = 0.0

    def start(self, info: RunInfo) -> None:
        self.console.print(describe_run(info), highlight=False)
        self.total, self.start_step, self.t0 = info.total_steps, info.start_step, time.perf_counter()
        self._bar = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:>12}"),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            disable=not self.console.is_terminal,
        )
        self._bar.start()
        self.task = self._bar.add_task(
            "train", total=info.total_steps, completed=info.start_step, rate="", loss="-"
        )

    def progress_rate(self, step: int) -> str:
        elapsed = time.perf_counter() - self.t0
        return rate_text((step - self.start_step) / elapsed) if elapsed > 0 else ""

    def progress(self, step: int, total: int, train_loss: float) -> None:
        if self._bar is not None:
            self._bar.update(self.task, completed=step, rate=self.progress_rate(step), loss=f"{train_loss:.4f}")

    def log(self, record: dict[str, Any]) -> None:
        self.console.print(format_record(record, self.total), highlight=False)

    def message(self, text: str) -> None:
        self.console.print(text, highlight=False)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
