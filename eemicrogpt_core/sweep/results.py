"""The sweep directory's record of outcomes: results.jsonl (append-only, the last record of a run wins) and
results.csv (rewritten from it, sorted by val loss, or by time to target when the runs have a target_loss),
plus the time-to-target summary the CLI prints."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any, TypeGuard

from ..base.atomic import append_text, atomic_write_text
from ..base.errors import ConfigError, StorageError, describe_os_error
from ..base.reading import read_regular_bytes
from .runner import DONE, UNAVAILABLE

JSONL_NAME = "results.jsonl"
CSV_NAME = "results.csv"
METRIC_COLUMNS = ("status", "train_loss", "val_loss", "steps", "total_steps", "us_per_step", "train_s", "wall_s",
                  "backend", "contended", "slowdown", "load_start", "load_end", "error")
# A record is under 1 KB and a sweep has at most 10,000 runs: 64 MiB holds each run's record several times over
# (one per re-run) and stops a results.jsonl that is a link to /dev/zero after that much.
MAX_RESULTS_BYTES = 64 << 20
# when a run has a target
TARGET_COLUMNS = ("target_loss", "target_metric", "reached", "steps_to_target", "seconds_to_target")


def finite(value: object) -> TypeGuard[float]:
    """A finite number (bools, which are ints to Python, are not numbers in a record)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def reached(record: dict[str, Any]) -> bool:
    """A finished run that reached its target_loss, with the training seconds it took."""
    return record.get("status") == DONE and record.get("reached") is True and finite(record.get("seconds_to_target"))


def sort_key(record: dict[str, Any]) -> tuple[int, float]:
    """Runs that reached their target first, fastest first; then finished runs by val loss; then the rest
    (interrupted, failed, unavailable) in a stable order. Without targets: by val loss, as before."""
    if reached(record):
        return (0, float(record["seconds_to_target"]))
    val = record.get("val_loss")
    if record.get("status") == DONE and finite(val):
        return (1, float(val))
    return (2, 0.0)


def varied_value(record: dict[str, Any], key: str) -> Any:
    """The value the sweep gave `key` for this run (records of older versions keep it only at the top level)."""
    varied = record.get("varied")
    return varied[key] if isinstance(varied, dict) and key in varied else record.get(key)


def outcome_column(column: str, varied_keys: list[str]) -> str:
    """A results column's header: an outcome named like a varied key (steps run vs the steps configured,
    the backend that ran vs the one asked for) is prefixed with actual_ so that no two columns share a name."""
    return f"actual_{column}" if column in varied_keys else column


def target_metric(record: dict[str, Any]) -> str:
    """The loss a run's target watched (records written before target_metric existed watched the train loss)."""
    metric = record.get("target_metric")
    return metric if isinstance(metric, str) else "train"


def has_target(rows: list[dict[str, Any]]) -> bool:
    return any(finite(r.get("target_loss")) for r in rows)


def target_summary(rows: list[dict[str, Any]]) -> list[str]:
    """Per target_loss of the runs: the fastest run to reach it and how many reached it, did not, or could not
    run here."""
    lines = []
    targets = {(target_metric(r), float(r["target_loss"])) for r in rows if finite(r.get("target_loss"))}
    for metric, target in sorted(targets):
        group = [r for r in rows if finite(r.get("target_loss")) and (target_metric(r), float(r["target_loss"]))
                 == (metric, target)]
        hits = sorted((r for r in group if reached(r)), key=sort_key)
        missed = sum(r.get("status") == DONE and not reached(r) for r in group)
        unavailable = sum(r.get("status") == UNAVAILABLE for r in group)
        other = len(group) - len(hits) - missed - unavailable
        counts = f"{len(hits)} of {len(group)} runs reached it, {missed} finished without reaching it"
        counts += f", {unavailable} unavailable here" if unavailable else ""
        counts += f", {other} failed or interrupted" if other else ""
        if hits:
            best = hits[0]
            lines.append(f"fastest to {metric} loss <= {target:g}: {best['run_id']} in {best['seconds_to_target']:.3f} "
                         f"s of training ({best['steps_to_target']:,} steps; {counts})")
        else:
            lines.append(f"no run reached {metric} loss <= {target:g} ({counts})")
    return lines


class ResultStore:
    def __init__(self, sweep_dir: Path, varied_keys: list[str]) -> None:
        self.dir = Path(sweep_dir)
        self.varied_keys = varied_keys
        self.latest: dict[str, dict[str, Any]] = {}
        try:
            text = read_regular_bytes(self.jsonl_path, "results log", MAX_RESULTS_BYTES, ConfigError).decode(
                "utf-8", "replace")
        except FileNotFoundError:
            text = ""
        if text:
            for line in text.splitlines():
                if line.strip():
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError:  # a line cut short by a crash: that run simply runs again
                        continue
                    if isinstance(record, dict) and isinstance(record.get("run_id"), str):
                        self.latest[record["run_id"]] = record

    @property
    def jsonl_path(self) -> Path:
        return self.dir / JSONL_NAME

    @property
    def csv_path(self) -> Path:
        return self.dir / CSV_NAME

    def finished(self, run_id: str) -> bool:
        return self.latest.get(run_id, {}).get("status") == DONE

    def add(self, record: dict[str, Any]) -> None:
        self.latest[record["run_id"]] = record
        try:
            append_text(self.jsonl_path, json.dumps(record) + "\n")
            self.write_csv()
        except OSError as e:
            if e.filename is None:  # a failed write() names no file
                e.filename = str(self.jsonl_path)
            raise StorageError(describe_os_error(e, "cannot record the sweep's results")) from None

    def rows(self, run_ids: list[str] | None = None) -> list[dict[str, Any]]:
        records = [self.latest[r] for r in (run_ids or self.latest) if r in self.latest]
        return sorted(records, key=sort_key)

    def write_csv(self) -> None:
        buf = io.StringIO()
        rows = self.rows()
        target = [c for c in TARGET_COLUMNS if c not in self.varied_keys] if has_target(rows) else []
        columns = [*METRIC_COLUMNS[:1], *target, *METRIC_COLUMNS[1:]]
        headers = {c: outcome_column(c, self.varied_keys) for c in columns}
        writer = csv.DictWriter(buf, ["run_id", *self.varied_keys, *headers.values()], extrasaction="ignore")
        writer.writeheader()
        for record in rows:
            row = {headers[c]: record.get(c) for c in columns}
            writer.writerow({"run_id": record.get("run_id"), **{k: varied_value(record, k) for k in self.varied_keys},
                             **row})
        atomic_write_text(self.csv_path, buf.getvalue())


def read_results(sweep_dir: Path) -> list[dict[str, Any]]:
    """The latest record per run, sorted by val loss (for plots and reports)."""
    return ResultStore(sweep_dir, []).rows()


def fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if abs(value) >= 0.01 or value == 0 else f"{value:.{digits}g}"
    return str(value)
