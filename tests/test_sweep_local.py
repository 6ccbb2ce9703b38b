"""`eemicrogpt sweep` with the local executor, end to end as a user runs it (a subprocess, numpy_ref so it runs on
any CPU): run directories, results files, the sorted table, failures, skipping finished runs, Ctrl-C and resume."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from eemicrogpt_core.training.checkpoint import load_checkpoint
from eemicrogpt_core.training.rundir import RunDir

CLI = [sys.executable, "-c", "from eemicrogpt_core.interface.cli import app; app()"]
TINY = {"d_model": 16, "backend": "numpy_ref", "eval_batches": 2, "log_every": 30, "chunk_steps": 10}


def sweep_cmd(spec: Path, out: Path, names: Path, *more: str) -> list[str]:
    return [*CLI, "sweep", str(spec), "--out", str(out), "--data", str(names), *more]


def write_spec(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_sweep_runs_records_sorts_and_skips_finished_runs(tmp_path: Path, names_file: Path) -> None:
    # lr 1e30 makes the loss non-finite at once: a failed run that must not stop the others.
    spec = write_spec(tmp_path / "s.yaml", {"name": "tiny", "base": TINY, "grid": {"lr": [0.003, 0.01, 1.0e30]},
                                             "steps": 60})
    out = tmp_path / "sw"
    first = subprocess.run(sweep_cmd(spec, out, names_file, "--workers", "2"), capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == 1, first.stdout + first.stderr  # 1: a run failed
    assert "2 workers on" in first.stdout and "pinned to" in first.stdout
    assert "done 2, running 0, failed 1" in first.stdout and "best" in first.stdout

    assert yaml.safe_load((out / "spec.yaml").read_text())["grid"] == {"lr": [0.003, 0.01, 1.0e30]}
    latest = {r["run_id"]: r for r in records(out)}
    assert set(latest) == {"lr=0.003", "lr=0.01", "lr=1e+30"}
    failed = latest["lr=1e+30"]
    assert failed["status"] == "failed" and "non-finite" in failed["error"] and "\n" not in failed["error"]
    for rid in ("lr=0.003", "lr=0.01"):
        r = latest[rid]
        assert r["status"] == "done" and r["steps"] == 60 and r["backend"] == "numpy_ref"
        run = RunDir(out / "runs" / rid)
        metrics = run.read_metrics()
        assert [m["step"] for m in metrics] == [30, 60]
        assert r["val_loss"] == metrics[-1]["val_loss"] and r["train_loss"] == metrics[-1]["train_loss"]
        assert load_checkpoint(run.checkpoint_path).config.lr == r["lr"]
        assert r["us_per_step"] > 0 and r["wall_s"] > 0 and r["train_s"] > 0

    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [row["run_id"] for row in rows][-1] == "lr=1e+30"  # failed last
    vals = [float(row["val_loss"]) for row in rows[:2]]
    assert vals == sorted(vals) and {row["run_id"] for row in rows[:2]} == {"lr=0.003", "lr=0.01"}
    assert list(rows[0])[:2] == ["run_id", "lr"] and "status" in rows[0] and "us_per_step" in rows[0]
    table = first.stdout[first.stdout.index("sorted by val loss"):]
    assert table.index(rows[0]["run_id"].split("=")[1]) < table.index(rows[1]["run_id"].split("=")[1])

    finished = {rid: (out / "runs" / rid / "checkpoint.npz").stat().st_mtime_ns for rid in ("lr=0.003", "lr=0.01")}
    again = subprocess.run(sweep_cmd(spec, out, names_file), capture_output=True, text=True, timeout=300)
    assert again.returncode == 1
    assert "3 runs: 2 already finished (skipped), 1 to run" in again.stdout
    assert {rid: (out / "runs" / rid / "checkpoint.npz").stat().st_mtime_ns for rid in finished} == finished
    assert [r["run_id"] for r in records(out)][3:] == ["lr=1e+30"]  # only the failed run was retried

    other = write_spec(tmp_path / "other.yaml", {"name": "tiny", "base": {**TINY, "eval_batches": 3},
                                                 "grid": {"lr": [0.02]}, "steps": 60})
    clash = subprocess.run(sweep_cmd(other, out, names_file), capture_output=True, text=True, timeout=300)
    assert clash.returncode == 2 and len(clash.stderr.splitlines()) == 1
    assert "different spec" in clash.stderr and "base eval_batches: 2 -> 3" in clash.stderr


def test_a_grown_grid_runs_only_the_new_runs(tmp_path: Path, names_file: Path) -> None:
    first = {"name": "grow", "base": TINY, "grid": {"lr": [0.01]}, "steps": 30}
    out = tmp_path / "sw"
    done = subprocess.run(sweep_cmd(write_spec(tmp_path / "a.yaml", first), out, names_file), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    kept = (out / "runs" / "lr=0.01" / "checkpoint.npz").stat().st_mtime_ns
    grown = write_spec(tmp_path / "b.yaml", {**first, "grid": {"lr": [0.01, 0.02]}})
    again = subprocess.run(sweep_cmd(grown, out, names_file), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "the grid changed since the last run" in again.stdout
    assert "2 runs: 1 already finished (skipped), 1 to run" in again.stdout
    assert (out / "runs" / "lr=0.01" / "checkpoint.npz").stat().st_mtime_ns == kept
    assert [r["run_id"] for r in records(out)] == ["lr=0.01", "lr=0.02"]
    assert yaml.safe_load((out / "spec.yaml").read_text())["grid"] == {"lr": [0.01, 0.02]}


def test_ctrl_c_stops_every_run_resumably_and_rerun_resumes(tmp_path: Path, names_file: Path) -> None:
    spec = write_spec(tmp_path / "s.yaml", {"base": {**TINY, "log_every": 20}, "grid": {"lr": [0.005, 0.01]},
                                            "steps": 4000})
    out = tmp_path / "sw"
    cmd = sweep_cmd(spec, out, names_file, "--workers", "2")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    checkpoints = [out / "runs" / rid / "checkpoint.npz" for rid in ("lr=0.005", "lr=0.01")]
    deadline = time.monotonic() + 120
    while not all(c.exists() for c in checkpoints):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # what Ctrl-C at the terminal sends the driver
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stdout + stderr
    assert "Ctrl-C" in stdout and "run the same command again to resume" in stdout
    stopped = {r["run_id"]: r for r in records(out)}
    assert {r["status"] for r in stopped.values()} == {"interrupted"}
    at = {}
    for rid, r in stopped.items():
        ckpt = load_checkpoint(out / "runs" / rid / "checkpoint.npz")
        assert 0 < ckpt.state.step < 4000 and ckpt.state.step == r["steps"]  # saved where it stopped
        at[rid] = int(ckpt.state.step)

    resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "0 already finished (skipped), 2 to run" in resumed.stdout
    final = {r["run_id"]: r for r in records(out)}
    for rid, step in at.items():
        assert final[rid]["status"] == "done" and final[rid]["steps"] == 4000
        assert final[rid]["resumed_from"] == step
        steps = [m["step"] for m in RunDir(out / "runs" / rid).read_metrics()]
        assert steps == sorted(set(steps)) and steps[-1] == 4000  # no step logged twice across the stop
    assert os.path.exists(out / "results.csv")
