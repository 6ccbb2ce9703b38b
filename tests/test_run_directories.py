"""Run directories: --out never writes among the user's files, a killed run's temporary files are cleaned up by
the next one, and a full disk is reported with the path it filled."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
from reporters import StopAt
from typer.testing import CliRunner

from eemicrogpt_core.backends.registry import load_registry
from eemicrogpt_core.base import atomic
from eemicrogpt_core.base.errors import StorageError
from eemicrogpt_core.interface import cli
from eemicrogpt_core.sweep.results import ResultStore
from eemicrogpt_core.training.config import TrainConfig
from eemicrogpt_core.training.rundir import LOCK_NAME, MARKER_NAME, RunDir
from eemicrogpt_core.training.trainer import train

RUNNER = CliRunner()
TINY = ["--backend", "numpy_ref", "--d-model", "16", "--steps", "20", "--log-every", "10"]


def run(*args: str):
    return RUNNER.invoke(cli.app, list(args), env={"EEMICROGPT_BACKEND": None})


def one_line(result, *fragments: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("eemicrogpt: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def test_out_refuses_a_directory_of_the_users(names_file: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The command from the field: the user's config.yaml (with their comments) and metrics.jsonl stay."""
    mine = tmp_path / "p"
    mine.mkdir()
    files = {"config.yaml": b"d_model: 16\nsteps: 5\n# notes\n", "metrics.jsonl": b'{"mine": 1}\n'}
    for name, data in files.items():
        (mine / name).write_bytes(data)
    monkeypatch.chdir(mine)
    result = run("train", "--config", "config.yaml", "--out", ".", "--backend", "numpy_ref", "--data", str(names_file))
    one_line(result, "--out . is not empty and was not made by eemicrogpt (it holds config.yaml, metrics.jsonl)",
             "choose a new or empty directory")
    assert {p.name: p.read_bytes() for p in mine.iterdir()} == files


def test_out_takes_an_empty_directory_and_one_eemicrogpt_made(names_file: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run("train", *TINY, "--data", str(names_file), "--out", str(empty)).exit_code == 0
    assert (empty / "checkpoint.npz").is_file() and (empty / MARKER_NAME).is_file()
    # A run killed before its first checkpoint leaves its directory marked: the next run may use it.
    crashed = RunDir.create(str(tmp_path / "crashed"), TrainConfig())
    crashed.write_config(TrainConfig())
    assert run("train", *TINY, "--data", str(names_file), "--out", str(crashed.path)).exit_code == 0
    one_line(run("train", *TINY, "--data", str(names_file), "--out", str(empty)), "already holds a run")


def test_a_killed_runs_temporary_files_are_removed_by_the_next(names_file: Path, tmp_path: Path) -> None:
    cfg = TrainConfig(d_model=16, steps=40, lr=0.01, backend="numpy_ref", data=str(names_file), log_every=10,
                      eval_batches=2, out=str(tmp_path / "run"))
    run_dir = RunDir.create(cfg.out, cfg)
    train(cfg, load_registry(), run_dir=run_dir, reporter=StopAt(10))
    orphans = [run_dir.path / ".checkpoint.npz.k3j_x9a2.tmp", run_dir.path / ".config.yaml.abcdefgh.tmp"]
    kept = [run_dir.path / ".checkpoint.npz.mine.tmp", run_dir.path / "notes.tmp", tmp_path / ".checkpoint.npz."
            "k3j_x9a2.tmp"]
    for path in orphans + kept:
        path.write_bytes(b"\0" * 1000)
    result = run("train", "--resume", str(run_dir.path), "--data", str(names_file))
    assert result.exit_code == 0, result.output
    assert not any(p.exists() for p in orphans) and all(p.exists() for p in kept)


def test_a_full_disk_on_resume_names_the_file(names_file: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = TrainConfig(d_model=16, steps=40, lr=0.01, backend="numpy_ref", data=str(names_file), log_every=10,
                      eval_batches=2, out=str(tmp_path / "run"))
    run_dir = RunDir.create(cfg.out, cfg)
    train(cfg, load_registry(), run_dir=run_dir, reporter=StopAt(10))
    before = {p.name: p.read_bytes() for p in run_dir.path.iterdir()}

    def full(fd: int) -> None:  # as write() or fsync() on a full disk: an OSError that names no file
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", full)
    result = run("train", "--resume", str(run_dir.path), "--data", str(names_file))
    one_line(result, f"cannot write the run directory {run_dir.config_path}: No space left on device",
             "free some disk space")
    after = {p.name: p.read_bytes() for p in run_dir.path.iterdir() if p.name != LOCK_NAME}  # the resume's flock
    assert after == before  # and no temporary file left


def _append_to_dev_full(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Opening `name` for appending opens /dev/full instead, whose every write fails with ENOSPC (a link to it
    would not do: logs are never written through a link)."""
    real_open = atomic.os.open

    def fake_open(path: Any, flags: int, mode: int = 0o777) -> int:
        return real_open("/dev/full", os.O_WRONLY) if Path(path).name == name else real_open(path, flags, mode)

    monkeypatch.setattr(atomic.os, "open", fake_open)


def test_a_full_disk_in_a_sweep_names_the_results_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("/dev/full (a device whose every write fails with ENOSPC) is Linux's")
    store = ResultStore(tmp_path, ["lr"])
    _append_to_dev_full(monkeypatch, "results.jsonl")
    with pytest.raises(StorageError, match=f"cannot record the sweep's results {tmp_path / 'results.jsonl'}: No "
                                           "space left on device; free some disk space"):
        store.add({"run_id": "lr=1", "lr": 1, "status": "done"})


def test_the_metrics_log_on_a_full_disk_names_itself(names_file: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("/dev/full is Linux's")
    run_dir = RunDir(tmp_path)
    _append_to_dev_full(monkeypatch, run_dir.metrics_path.name)
    with pytest.raises(OSError) as caught:
        run_dir.append_metric({"step": 1})
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(run_dir.metrics_path)
