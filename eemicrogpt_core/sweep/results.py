"""The sweep directory's record of outcomes: results.jsonl (append-only, the last record of a run wins) and
results.csv (rewritten from it, sorted by val loss), plus the table the CLI prints."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from ..atomic import atomic_write_text
from .runner import DONE

JSONL_NAME = "results.jsonl"
CSV_NAME = "results.csv"
METRIC_COLUMNS = ("status", "train_loss", "val_loss", "steps", "total_steps", "us_per_step", "train_s", "wall_s",
                  "backend", "contended", "slowdown", "load_start", "load_end", "error")


def sort_key(record: dict[str, Any]) -> tuple[int, float]:
    """Finished runs by val loss first; then the rest (interrupted, failed) in a stable order."""
    val = record.get("val_loss")
    if record.get("status") == DONE and isinstance(val, (int, float)) and math.isfinite(val):
        return (0, float(val))
    return (1, 0.0)


class ResultStore:
    def __init__(self, sweep_dir: Path, varied_keys: list[str]) -> None:
        self.dir = Path(sweep_dir)
        self.varied_keys = varied_keys
        self.latest: dict[str, dict[str, Any]] = {}
        if self.jsonl_path.is_file():
            for line in self.jsonl_path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError:  # a line cut short by a crash: that run simply runs again
                        continue
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
        with self.jsonl_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        self.write_csv()

    def rows(self, run_ids: list[str] | None = None) -> list[dict[str, Any]]:
        records = [self.latest[r] for r in (run_ids or self.latest) if r in self.latest]
        return sorted(records, key=sort_key)

    def write_csv(self) -> None:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, ["run_id", *self.varied_keys, *METRIC_COLUMNS], extrasaction="ignore")
        writer.writeheader()
        for record in self.rows():
            writer.writerow(record)
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
