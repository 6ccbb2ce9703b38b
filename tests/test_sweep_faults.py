"""Sweep faults: specs that expand to too many runs, too many workers, two sweeps into one directory, a re-run
after damage, a dead worker, a damaged spec.yaml. Sizes are checked without building what they count."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml

from eemicrogpt_core.base.errors import ConfigError
from eemicrogpt_core.sweep.local import MAX_WORKERS_PER_CORE, worker_count
from eemicrogpt_core.sweep.spec import MAX_RUNS, expand, parse_spec, run_count
from eemicrogpt_core.training.rundir import lock_directory

CLI = [sys.executable, "-c", "from eemicrogpt_core.interface.cli import app; app()"]
TINY = {"d_model": 16, "backend": "numpy_ref", "eval_batches": 2, "log_every": 20, "chunk_steps": 10}


def sweep(spec: Path, out: Path, names: Path, *more: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "sweep", str(spec), "--out", str(out), "--data", str(names), *more],
                          capture_output=True, text=True, timeout=timeout)


def write_spec(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def one_line(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("eemicrogpt: error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def records(out: Path) -> dict[str, dict]:
    lines = map(json.loads, (out / "results.jsonl").read_text().splitlines())
    return {r["run_id"]: r for r in lines if isinstance(r, dict) and "run_id" in r}


# ---- sizes --------------------------------------------------------------------------------------------------
def test_a_grid_of_ten_million_runs_is_refused_before_any_is_built() -> None:
    grid = {key: [0.001 * (i + 1) for i in range(10)] for key in ("lr", "val_fraction")}
    grid.update({key: list(range(1, 11)) for key in ("batch", "log_every", "eval_batches", "chunk_steps", "steps")})
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        with pytest.raises(ConfigError, match=r"expands to 10,000,000 runs \(lr 10 x val_fraction 10 x batch 10 "
                                              r"x .*\); a sweep may have at most 10,000"):
            parse_spec({"grid": grid}, "big.yaml")
        seconds, peak = time.perf_counter() - t0, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 10 << 20 and seconds < 5, (peak, seconds)  # it was 8.7 GB in 20 s


def test_a_huge_random_count_is_refused_before_any_draw() -> None:
    data = {"random": {"count": 10_000_000_000, "parameters": {"lr": {"distribution": "log_uniform",
                                                                      "min": 0.001, "max": 0.1}}}}
    with pytest.raises(ConfigError, match=r"expands to 10,000,000,000 runs \(random.count 10000000000\)"):
        parse_spec(data, "r.yaml")
    data["random"]["count"] = 3
    spec = parse_spec({**data, "seeds": [1, 2]}, "r.yaml")
    assert run_count(spec) == 6 == len(expand(spec)) and MAX_RUNS == 10_000


def test_workers_are_bounded_by_the_runs_and_the_cores() -> None:
    assert worker_count(None, 10, 2) == (None, "")  # one per core
    assert worker_count(3, 10, 2) == (3, "")  # above the cores: allowed, the placement warns
    n, note = worker_count(8, 3, 2)
    assert n == 3 and note == "3 workers, not --workers 8: the sweep has 3 runs"
    assert worker_count(None, 1, 2)[0] == 1
    with pytest.raises(ConfigError, match=rf"--workers 100,000 is more than {MAX_WORKERS_PER_CORE} per physical "
                                          rf"core \({2 * MAX_WORKERS_PER_CORE} here\)"):
        worker_count(100_000, 4, 2)
    with pytest.raises(ConfigError, match="--workers must be >= 1"):
        worker_count(0, 4, 2)


def test_sweep_cli_with_100000_workers_is_one_line_and_starts_nothing(tmp_path: Path, names_file: Path) -> None:
    spec = write_spec(tmp_path / "s.yaml", {"base": TINY, "grid": {"lr": [0.01, 0.02]}, "steps": 20})
    proc = sweep(spec, tmp_path / "sw", names_file, "--workers", "100000", timeout=60)
    one_line(proc, "--workers 100,000 is more than")
    assert not (tmp_path / "sw").exists()


def test_more_workers_than_runs_start_only_as_many_as_runs(tmp_path: Path, names_file: Path) -> None:
    spec = write_spec(tmp_path / "s.yaml", {"base": TINY, "grid": {"lr": [0.01]}, "steps": 20})
    proc = sweep(spec, tmp_path / "sw", names_file, "--workers", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 worker on" in proc.stdout and "1 worker, not --workers 2: the sweep has 1 run" in proc.stdout


# ---- one sweep per directory, and repairs ---------------------------------------------------------------------
def test_a_second_sweep_into_a_busy_directory_is_refused(tmp_path: Path, names_file: Path) -> None:
    spec = write_spec(tmp_path / "s.yaml", {"base": TINY, "grid": {"lr": [0.01, 0.02]}, "steps": 20})
    out = tmp_path / "sw"
    out.mkdir()
    fd = lock_directory(out, "held by the test")  # what a running sweep holds
    try:
        one_line(sweep(spec, out, names_file), f"{out} is in use by another eemicrogpt sweep")
    finally:
        os.close(fd)
    assert sorted(p.name for p in out.iterdir()) == [".lock"]  # nothing written while it was refused
    assert sweep(spec, out, names_file).returncode == 0  # a directory holding only .lock is a sweep's


def test_a_rerun_repairs_runs_recorded_done_without_their_directory(tmp_path: Path, names_file: Path) -> None:
    spec = write_spec(tmp_path / "s.yaml", {"base": TINY, "grid": {"lr": [0.01, 0.02, 0.03]}, "steps": 20})
    out = tmp_path / "sw"
    assert sweep(spec, out, names_file).returncode == 0
    for rid in ("lr=0.01", "lr=0.02"):  # as another sweep into the same directory left them
        (out / "runs" / rid / "checkpoint.npz").unlink()
    with (out / "results.jsonl").open("a") as f:
        f.write(json.dumps({"run_id": "lr=0.03", "status": "done"}) + "\n")  # done, but without its numbers
        f.write('["not", "a", "record"]\n{"no_run_id": 1}\n')
    kept = (out / "runs" / "lr=0.03" / "checkpoint.npz").stat().st_mtime_ns
    proc = sweep(spec, out, names_file)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 runs: 0 already finished (skipped), 3 to run" in proc.stdout
    latest = records(out)
    for rid in ("lr=0.01", "lr=0.02", "lr=0.03"):
        assert latest[rid]["status"] == "done" and isinstance(latest[rid]["val_loss"], float), latest[rid]
        assert (out / "runs" / rid / "checkpoint.npz").is_file()
    assert latest["lr=0.03"]["resumed_from"] == 20  # reported from its finished checkpoint, not retrained
    assert (out / "runs" / "lr=0.03" / "checkpoint.npz").stat().st_mtime_ns == kept


def test_a_damaged_spec_yaml_in_the_sweep_directory_is_one_line(tmp_path: Path, names_file: Path) -> None:
    spec = write_spec(tmp_path / "s.yaml", {"base": TINY, "grid": {"lr": [0.01]}, "steps": 20})
    out = tmp_path / "sw"
    assert sweep(spec, out, names_file).returncode == 0
    (out / "spec.yaml").write_text("x: [\n")
    one_line(sweep(spec, out, names_file), f"{out / 'spec.yaml'} is damaged", "restore it")
    assert (out / "spec.yaml").read_text() == "x: [\n"


# ---- a dead worker ------------------------------------------------------------------------------------------
def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_a_killed_worker_fails_its_run_and_is_replaced(tmp_path: Path, names_file: Path) -> None:
    if not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists():
        pytest.skip("finding the worker process needs Linux's /proc/PID/task/TID/children")
    spec = write_spec(tmp_path / "s.yaml", {"base": TINY, "grid": {"run": [
        {"lr": 0.01, "steps": 100000}, {"lr": 0.005, "steps": 20}, {"lr": 0.003, "steps": 20}]}})
    out = tmp_path / "sw"
    proc = subprocess.Popen([*CLI, "sweep", str(spec), "--out", str(out), "--data", str(names_file), "--workers",
                             "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = out / "runs" / "lr=0.01,steps=100000" / "checkpoint.npz"
    deadline = time.monotonic() + 120
    while not first.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    workers = _children(proc.pid)
    assert len(workers) == 1, workers
    os.kill(workers[0], signal.SIGKILL)  # the only worker, by its id
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1, stdout + stderr  # 1: a run failed, the others finished
    latest = records(out)
    lost = latest["lr=0.01,steps=100000"]
    assert lost["status"] == "failed"
    assert "its worker process was killed by SIGKILL during the run" in lost["error"]
    assert "a new worker took its place" in lost["error"]
    assert {latest[r]["status"] for r in ("lr=0.005,steps=20", "lr=0.003,steps=20")} == {"done"}
    assert "Traceback" not in stderr


def test_a_worker_whose_driver_is_gone_exits_without_a_traceback() -> None:
    """After the driver dies (a second Ctrl-C), each worker's next write meets a closed pipe: one quiet exit each,
    not a BrokenPipeError traceback per worker."""
    proc = subprocess.Popen([sys.executable, "-m", "eemicrogpt_core.sweep.worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the driver's end of the protocol pipe
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 141, stderr
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
