"""Signals to a real `eemicrogpt sweep` subprocess: SIGTERM and SIGHUP end it as Ctrl-C does (each worker's run
stops at a checkpoint and is recorded, results.csv is written, no worker outlives the driver, and a re-run
resumes), and a driver killed outright takes its workers with it (Linux). Bounded in time throughout."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

CLI = [sys.executable, "-c", "from eemicrogpt_core.interface.cli import app; app()"]
# Runs far longer than the test waits: only a signal ends them.
LONG = {"d_model": 16, "backend": "numpy_ref", "eval_batches": 2, "log_every": 100, "chunk_steps": 20,
        "steps": 1_000_000}
PATIENCE_S = 120  # for a loaded machine: a sweep's start and a chunk of d16 take well under a second when quiet

pytestmark = pytest.mark.skipif(not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists(),
                                reason="finding the worker processes needs Linux's /proc/PID/task/TID/children")


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by its parent, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start(spec: Path, out: Path, names: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([*CLI, "sweep", str(spec), "--out", str(out), "--data", str(names), "--workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_until_training(proc: subprocess.Popen[str], out: Path, runs: int) -> list[int]:
    """The worker pids once every run has logged its first record (each worker is inside a run)."""
    deadline = time.monotonic() + PATIENCE_S
    while True:
        logs = list(out.glob("runs/*/metrics.jsonl"))
        if len(logs) == runs and all(p.stat().st_size > 0 for p in logs):
            return _children(proc.pid)
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)


def _no_worker_survives(workers: list[int]) -> None:
    deadline = time.monotonic() + 30  # an orphan would train for minutes; the workers end within seconds
    while any(_alive(w) for w in workers):
        assert time.monotonic() < deadline, [w for w in workers if _alive(w)]
        time.sleep(0.1)


def _logged_past(run_dir: Path, step: int) -> bool:
    """The run has logged a record past `step` (it is training again, beyond where it stopped)."""
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            if json.loads(line).get("step", 0) > step:
                return True
        except ValueError:  # a line being written as we read
            continue
    return False


def _csv_rows(out: Path) -> dict[str, dict[str, str]]:
    with (out / "results.csv").open() as f:
        return {row["run_id"]: row for row in csv.DictReader(f)}


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"base": LONG, "grid": {"lr": [0.01, 0.02]}}))
    return path


@pytest.mark.parametrize(("first", "second"), [(signal.SIGTERM, signal.SIGHUP), (signal.SIGHUP, signal.SIGINT)])
def test_a_signal_stops_the_sweep_records_its_runs_and_a_rerun_resumes(first: signal.Signals, second: signal.Signals,
                                                                       spec: Path, tmp_path: Path,
                                                                       names_file: Path) -> None:
    out = tmp_path / "sw"
    proc = _start(spec, out, names_file)
    workers = _wait_until_training(proc, out, 2)
    assert len(workers) == 2, workers
    proc.send_signal(first)
    stdout, stderr = proc.communicate(timeout=PATIENCE_S)
    assert proc.returncode == 128 + first, stdout + stderr
    assert "Traceback" not in stderr, stderr
    _no_worker_survives(workers)
    rows = _csv_rows(out)
    assert {r["status"] for r in rows.values()} == {"interrupted"}, rows
    stopped = {run_id: int(r["steps"]) for run_id, r in rows.items()}
    assert all(steps > 0 for steps in stopped.values()), stopped

    # The re-run takes the same directory (no "in use by another eemicrogpt run") and continues each run from
    # its checkpoint; it is stopped too, by another signal.
    proc = _start(spec, out, names_file)
    deadline = time.monotonic() + PATIENCE_S
    while len(_children(proc.pid)) < 2 or not all(_logged_past(out / "runs" / run_id, steps)
                                                  for run_id, steps in stopped.items()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    workers = _children(proc.pid)
    proc.send_signal(second)
    stdout, stderr = proc.communicate(timeout=PATIENCE_S)
    assert proc.returncode == 128 + second, stdout + stderr
    assert "in use by another" not in stdout + stderr and "Traceback" not in stderr
    _no_worker_survives(workers)
    latest = {}
    for line in (out / "results.jsonl").read_text().splitlines():
        record = json.loads(line)
        latest[record["run_id"]] = record
    for run_id, steps in stopped.items():
        assert latest[run_id]["status"] == "interrupted"
        assert latest[run_id]["resumed_from"] >= steps  # from its checkpoint, not from scratch
        assert latest[run_id]["steps"] >= latest[run_id]["resumed_from"]


def test_a_driver_killed_outright_takes_its_workers_with_it(spec: Path, tmp_path: Path, names_file: Path) -> None:
    """SIGKILL cannot be handled: the kernel sends each worker SIGTERM (PR_SET_PDEATHSIG), which stops its run at a
    checkpoint, and nothing keeps training."""
    out = tmp_path / "sw"
    proc = _start(spec, out, names_file)
    workers = _wait_until_training(proc, out, 2)
    proc.kill()
    proc.communicate(timeout=PATIENCE_S)
    _no_worker_survives(workers)
    assert len(list(out.glob("runs/*/checkpoint.npz"))) == 2
