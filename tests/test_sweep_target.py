"""Sweeps with a target_loss: time to target per run in results.jsonl/csv, the summary naming the fastest run,
runs that did not reach it; runs of a precision no backend here computes in are skipped, not fatal; runs of
several threads get workers of several cores."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eemicrogpt_core.sweep.placement import place_workers
from eemicrogpt_core.sweep.results import sort_key, target_summary
from eemicrogpt_core.sweep.spec import expand, load_spec
from eemicrogpt_core.training.rundir import RunDir

CLI = [sys.executable, "-c", "from eemicrogpt_core.interface.cli import app; app()"]
# Every reduced-precision backend off, whatever this machine has: bf16 runs then have no backend anywhere.
REDUCED = "avx512_bf16,amx_bf16,sme2_f16,sme2_f16w"
# d16 at lr 0.01 gets its train loss to 2.4 in a few hundred steps; at lr 0.0005 it is still far above it
# after 600 (the loss falls about twenty times slower).
TINY = {"d_model": 16, "backend": "auto", "eval_batches": 2, "log_every": 1000, "chunk_steps": 25,
        "target_loss": 2.4}


def sweep(spec: Path, out: Path, names: Path, disable: str = REDUCED) -> subprocess.CompletedProcess:
    env = {**os.environ, "EEMICROGPT_DISABLE_PLUGINS": disable}
    env.pop("EEMICROGPT_BACKEND", None)
    return subprocess.run([*CLI, "sweep", str(spec), "--out", str(out), "--data", str(names), "--workers", "1"],
                          capture_output=True, text=True, timeout=300, env=env)


def write_spec(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def latest(out: Path) -> dict[str, dict]:
    return {r["run_id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}


def test_a_target_sweep_reports_time_to_target_and_skips_unavailable_runs(tmp_path: Path, names_file: Path) -> None:
    spec = write_spec(tmp_path / "s.yaml", {"name": "tt", "base": TINY, "steps": 600,
                                            "grid": {"lr": [0.01, 0.0005], "precision": ["fp32", "bf16"]}})
    out = tmp_path / "sw"
    proc = sweep(spec, out, names_file)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 runs: 0 already finished (skipped), 2 unavailable here (skipped), 2 to run" in proc.stdout
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("skipped ")]
    assert len(skipped) == 1 and "2 runs of precision bf16, unavailable here" in skipped[0], proc.stdout

    records = latest(out)
    fast, slow = records["lr=0.01,precision=fp32"], records["lr=0.0005,precision=fp32"]
    for rid in ("lr=0.01,precision=bf16", "lr=0.0005,precision=bf16"):
        assert records[rid]["status"] == "unavailable" and "precision=bf16" in records[rid]["error"]
        assert not (out / "runs" / rid).exists()
    assert fast["status"] == "done" and fast["reached"] is True and fast["target_loss"] == 2.4
    last = RunDir(out / "runs" / fast["run_id"]).read_metrics()[-1]
    assert fast["steps_to_target"] == last["steps_to_target"] and fast["seconds_to_target"] == last["seconds_to_target"]
    assert fast["steps_to_target"] <= fast["steps"] < 600  # stopped at the target, not at the cap
    assert slow["status"] == "done" and slow["reached"] is False and slow["steps"] == 600
    assert slow["seconds_to_target"] is None

    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["run_id"] for r in rows][:2] == [fast["run_id"], slow["run_id"]]  # reached first
    assert rows[0]["reached"] == "True" and float(rows[0]["seconds_to_target"]) == fast["seconds_to_target"]
    assert {r["status"] for r in rows[2:]} == {"unavailable"}
    table = proc.stdout[proc.stdout.index("sorted by time to target"):]
    assert "not reached" in table
    assert (f"fastest to train loss <= 2.4: {fast['run_id']} in {fast['seconds_to_target']:.3f} s of training "
            f"({fast['steps_to_target']:,} steps; 1 of 4 runs reached it, 1 finished without reaching it, 2 "
            "unavailable here)") in proc.stdout

    again = sweep(spec, out, names_file)  # finished runs are skipped; unavailable ones are checked again
    assert again.returncode == 0, again.stdout + again.stderr
    assert "4 runs: 2 already finished (skipped), 2 unavailable here (skipped), 0 to run" in again.stdout


def test_a_sweep_of_which_nothing_runs_here_says_so(tmp_path: Path, names_file: Path) -> None:
    spec = write_spec(tmp_path / "s.yaml", {"base": TINY, "steps": 10, "grid": {"precision": ["bf16"], "lr": [0.01]}})
    proc = sweep(spec, tmp_path / "sw", names_file)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert "no run of this sweep can run here" in lines[0] and "precision=bf16" in lines[0]


def test_a_named_backend_that_cannot_run_is_still_an_error(tmp_path: Path, names_file: Path) -> None:
    spec = write_spec(tmp_path / "s.yaml", {"base": {**TINY, "backend": "numpy_ref"}, "steps": 10,
                                            "grid": {"precision": ["fp32", "bf16"]}})
    proc = sweep(spec, tmp_path / "sw", names_file)
    assert proc.returncode == 2 and "not the requested precision bf16" in proc.stderr, proc.stdout + proc.stderr


def test_summary_names_the_fastest_run_per_target() -> None:
    rows = [
        {"run_id": "a", "status": "done", "target_loss": 2.0, "reached": True, "seconds_to_target": 1.5,
         "steps_to_target": 900, "val_loss": 2.0},
        {"run_id": "b", "status": "done", "target_loss": 2.0, "reached": True, "seconds_to_target": 0.5,
         "steps_to_target": 1200, "val_loss": 2.1},
        {"run_id": "c", "status": "done", "target_loss": 2.0, "reached": False, "val_loss": 1.9},
        {"run_id": "d", "status": "failed", "target_loss": 2.0, "error": "boom"},
        {"run_id": "e", "status": "done", "target_loss": 1.5, "reached": False, "val_loss": 1.8},
    ]
    assert target_summary(rows) == [
        "no run reached train loss <= 1.5 (0 of 1 runs reached it, 1 finished without reaching it)",
        "fastest to train loss <= 2: b in 0.500 s of training (1,200 steps; 2 of 4 runs reached it, 1 finished "
        "without reaching it, 1 failed or interrupted)",
    ]
    # reached runs by time, then finished ones by val loss, then the rest
    assert [r["run_id"] for r in sorted(rows, key=sort_key)] == ["b", "a", "e", "c", "d"]


def test_summary_keeps_train_and_validation_targets_apart() -> None:
    rows = [
        {"run_id": "t", "status": "done", "target_loss": 1.88, "reached": True, "seconds_to_target": 3.0,
         "steps_to_target": 300, "val_loss": 2.0},
        {"run_id": "v", "status": "done", "target_loss": 1.88, "target_metric": "val", "reached": True,
         "seconds_to_target": 9.0, "steps_to_target": 800, "val_loss": 1.87},
    ]
    assert target_summary(rows) == [
        "fastest to train loss <= 1.88: t in 3.000 s of training (300 steps; 1 of 1 runs reached it, 0 finished "
        "without reaching it)",
        "fastest to val loss <= 1.88: v in 9.000 s of training (800 steps; 1 of 1 runs reached it, 0 finished "
        "without reaching it)",
    ]


@pytest.mark.parametrize(("cores", "per_worker", "expected"), [
    ([[0, 2], [1, 3]], 2, [[0, 1]]),  # both cores (first CPU of each) for one worker
    ([[0], [1], [2], [3]], 2, [[0, 1], [2, 3]]),
    ([[0], [1]], 3, [[0, 1]]),  # more threads than cores: every core, one worker
    ([[0, 2], [1, 3]], 1, [[0], [1]]),  # one thread per run: one worker per core, as before
])
def test_runs_of_several_threads_get_workers_of_several_cores(cores: list[list[int]], per_worker: int,
                                                               expected: list[list[int]]) -> None:
    placement = place_workers(None, cores, per_worker)
    assert placement.cpus == expected and not placement.shared
    if len(expected[0]) > 1:
        assert f"{len(expected[0])} cores each" in placement.describe()


def test_the_time_to_2_spec_covers_its_grid_with_a_cap_on_every_run() -> None:
    spec = load_spec("time_to_2")
    runs = expand(spec)
    assert len(runs) == 3 * 3 * 3 * 2 * 2
    configs = [r.config for r in runs]
    assert {c.target_loss for c in configs} == {2.0} and {c.time_budget for c in configs} == {None}
    assert {c.d_model for c in configs} == {16, 32, 64} and {c.precision for c in configs} == {"fp32", "bf16"}
    assert {c.threads for c in configs} == {1, 2} and {c.batch for c in configs} == {16, 32, 64}
    assert any(c.d_model == 32 and c.batch == 64 and c.lr == 0.007 for c in configs)  # the seed's best cell
    assert all(c.steps <= 16000 for c in configs)  # each run ends at its cap when it never gets there
