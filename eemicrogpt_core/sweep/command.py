"""`eemicrogpt sweep SPEC.yaml`: everything is checked before the first run starts; then the executor runs
what is unfinished and the table of results is printed, sorted by val loss (by time to target, with the
fastest run named, when the runs have a target_loss)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..backends.registry import load_registry
from ..base.errors import ConfigError
from ..base.paths import resolved_dir, user_path
from .driver import Executor, SweepOutcome, check_backends, prepare_runs, run_sweep
from .progress import SweepProgress
from .results import fmt, has_target, reached, target_summary, varied_value
from .runner import DONE, UNAVAILABLE
from .spec import load_spec

EXECUTORS = ("local", "ray")
DEFAULT_ROOT = Path("sweeps")


def _value(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else fmt(value)


def _to_target(record: dict[str, Any]) -> list[str]:
    """The time-to-target cells: seconds and steps, or why there are none."""
    if reached(record):
        return [fmt(record.get("seconds_to_target"), 3), fmt(record.get("steps_to_target"))]
    if record.get("status") == DONE:
        return ["not reached", "-"]
    return ["-", "-"]


def results_table(outcome: SweepOutcome, varied_keys: list[str]) -> Table:
    target = has_target(outcome.rows)
    extra = ["s to target", "steps to target"] if target else []
    order = "time to target" if target else "val loss"
    table = Table("#", *varied_keys, "status", *extra, "val loss", "train loss", "steps", "us/step", "train s",
                  "backend", title=f"{outcome.sweep_dir} (sorted by {order})")
    for i, r in enumerate(outcome.rows, 1):
        status = r.get("status", "?")
        if r.get("error") and status != UNAVAILABLE:  # the reason is in the "skipped" line and results.jsonl
            status = f"{status}: {r['error']}"
        table.add_row(str(i), *(_value(varied_value(r, k)) for k in varied_keys), status,
                      *(_to_target(r) if target else []), fmt(r.get("val_loss")),
                      fmt(r.get("train_loss")), fmt(r.get("steps")), fmt(r.get("us_per_step"), 1),
                      fmt(r.get("train_s"), 2), fmt(r.get("backend")))
    return table


def sweep_command(spec_path: str | Path, *, out: Path | None, executor: str, address: str | None, workers: int | None,
                  backend: str | None, data: str | None, console: Console) -> SweepOutcome:
    if executor not in EXECUTORS:
        raise ConfigError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    if address is not None and executor != "ray":
        raise ConfigError("--address is for --executor ray")
    if workers is not None and executor != "local":
        raise ConfigError("--workers is for the local executor (Ray gives each run one CPU of the cluster)")
    spec = load_spec(spec_path)
    runs = prepare_runs(spec, backend, data)
    sweep_dir = resolved_dir(user_path(out, "--out")) if out is not None else DEFAULT_ROOT / spec.name
    unavailable: dict[str, str] = {}  # Ray: each node's runner reports what it cannot run
    if executor == "ray":
        from .ray_executor import RayExecutor  # Ray is an optional extra: imported only when asked for

        ex: Executor = RayExecutor.connect(address, runs, console)
    else:
        from .local import LocalExecutor

        unavailable = check_backends(runs, load_registry())
        runnable = [r for r in runs if r.run_id not in unavailable]
        ex = LocalExecutor(workers, runs=len(runnable), threads=max(r.config.threads or 1 for r in runnable))
    outcome = run_sweep(spec, runs, sweep_dir, ex, SweepProgress(console), unavailable)
    console.print(results_table(outcome, spec.varied_keys))
    for line in target_summary(outcome.rows):
        console.print(line, highlight=False, soft_wrap=True)  # whole, for logs and greps
    console.print(f"results: {sweep_dir / 'results.csv'} and results.jsonl; run directories under "
                  f"{sweep_dir / 'runs'}", highlight=False)
    if outcome.interrupted:
        console.print("interrupted: run the same command again to resume (finished runs are skipped)",
                      highlight=False)
    return outcome
