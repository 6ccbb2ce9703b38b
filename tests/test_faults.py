"""Faults and bad files end in one clear line (exit 2) and lose nothing.

Each class is hit through the CLI as a user would hit it, with unit tests beside where the CLI cannot reach
(thread races, the memory estimate, fsync of the directory).
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from reporters import StopAt
from typer.testing import CliRunner

from eemicrogpt_core import __version__
from eemicrogpt_core.backends.backend import TrainState
from eemicrogpt_core.backends.registry import BackendRegistry, open_session
from eemicrogpt_core.backends.validate import SessionBusyError, ValidatedSession
from eemicrogpt_core.base import atomic
from eemicrogpt_core.base.errors import CheckpointError, ConfigError
from eemicrogpt_core.data import datafile
from eemicrogpt_core.data.names import BatchSampler, encode, read_names
from eemicrogpt_core.interface import cli
from eemicrogpt_core.model.shape import DEFAULT_CONTEXT, ModelShape, init_params
from eemicrogpt_core.model.vocab import Vocabulary
from eemicrogpt_core.training import checkpoint
from eemicrogpt_core.training.checkpoint import load_checkpoint
from eemicrogpt_core.training.config import TrainConfig, load_config
from eemicrogpt_core.training.limits import (
    WHOLE_BATCH,
    activation_bytes,
    check_memory,
    describe_estimate,
    estimated_bytes,
)
from eemicrogpt_core.training.rundir import RunDir
from eemicrogpt_core.training.trainer import NullReporter, train

RUNNER = CliRunner()
TINY = ["--d-model", "16", "--log-every", "100"]

CLI = "from eemicrogpt_core.interface.cli import app; app()"  # the eemicrogpt command in this interpreter


def run(*args: str, env: dict[str, str] | None = None):
    base = {"EEMICROGPT_BACKEND": None, "EEMICROGPT_DATA": None}
    return RUNNER.invoke(cli.app, list(args), env={**base, **(env or {})})


def assert_one_line_error(result, *fragments: str, code: int = 2) -> str:
    assert result.exit_code == code, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("eemicrogpt: error: ")
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]



@pytest.fixture(scope="module")
def half_run(names_file: Path, registry: BackendRegistry, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A numpy_ref d16 run of 300 steps, stopped (and saved) at step 100."""
    cfg = TrainConfig(d_model=16, steps=300, lr=0.01, backend="numpy_ref", data=str(names_file), log_every=100,
                      eval_batches=4, out=str(tmp_path_factory.mktemp("half") / "run"))
    run_dir = RunDir.create(cfg.out, cfg)
    result = train(cfg, registry, run_dir=run_dir, reporter=StopAt(100))
    assert result.interrupted and load_checkpoint(run_dir.checkpoint_path).state.step == 100
    return run_dir.path


@pytest.fixture
def run_copy(half_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(half_run, tmp_path / "run"))


def backends_here(registry: BackendRegistry, names: tuple[str, ...]) -> list[str]:
    return [n for n in names if (e := registry.get(n)) is not None and e.available]


# ---------------------------------------------------------------------------------------------- divergence


@pytest.mark.parametrize("backend", ["numpy_ref", "avx512", "avx2"])
def test_real_backend_divergence_is_one_line(backend: str, registry: BackendRegistry, names_file: Path,
                                             tmp_path: Path) -> None:
    """lr 1e30 overflows float32 within two updates on every backend (Adam's step is ~lr)."""
    if backend not in backends_here(registry, (backend,)):
        pytest.skip(f"{backend} cannot run on this CPU")
    out = tmp_path / "run"
    result = run("train", "--backend", backend, "--data", str(names_file), *TINY, "--steps", "300",
                 "--lr", "1e30", "--out", str(out))
    line = assert_one_line_error(result, "training diverged", "at step 2", "try a lower --lr (now 1e+30, e.g. 0.01)",
                                 "nothing was saved")
    assert "non-finite" in line
    assert not (out / "checkpoint.npz").exists()


def test_divergence_keeps_the_last_good_checkpoint(run_copy: Path, names_file: Path) -> None:
    """The saved run continues at a tampered, huge lr: it diverges after step 100 and the step-100 file stays."""
    ckpt = load_checkpoint(run_copy / "checkpoint.npz")
    checkpoint.save_checkpoint(run_copy / "checkpoint.npz",
                               dataclasses.replace(ckpt, config=dataclasses.replace(ckpt.config, lr=1e30)))
    before = (run_copy / "checkpoint.npz").read_bytes()
    result = run("train", "--resume", str(run_copy), "--data", str(names_file))
    kept = f"the last good checkpoint (step 100) is kept in {run_copy}"
    # Step 102 where the backend checks its parameters after each update, 103 where only the loss shows it.
    line = assert_one_line_error(result, "diverged", kept)
    assert re.search(r"at step 10[23]\b", line), line
    assert (run_copy / "checkpoint.npz").read_bytes() == before


# --------------------------------------------------------------------------------------------- checkpoints


def _members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _rewrite(path: Path, meta: str | None = None, **members: bytes) -> None:
    parts = _members(path)
    if meta is not None:
        parts["meta.npy"] = _npy(np.array(meta))
    parts.update({f"{k}.npy": v for k, v in members.items()})
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in parts.items():
            zf.writestr(name, data)


def _meta(path: Path) -> dict[str, Any]:
    return json.loads(str(np.load(io.BytesIO(_members(path)["meta.npy"]))))


def _huge_header_npy(n: int) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (n,)})
    return buf.getvalue() + b"\0" * 64


def _tampered_meta(field: str, value: Any) -> Any:
    def change(meta: dict[str, Any]) -> str:
        target, key = (meta["config"], field[7:]) if field.startswith("config.") else (meta, field)
        if key.startswith("sampler."):
            target, key = meta["sampler_state"], key[8:]
        target[key] = value
        return json.dumps(meta)

    return change


@pytest.mark.parametrize(
    ("damage", "fragment"),
    [
        ("empty", "empty file (0 bytes)"),
        ("truncated", "unreadable checkpoint: not a zip archive"),
        ("npy", "a plain .npy array"),
        ("meta:step=NaN", "non-finite number NaN"),
        ("meta:step=huge", "step 1000000000000000000000000000000 is outside 0..300"),
        ("meta:step=str", "step must be an integer, got str"),
        ("meta:step=float", "step must be an integer, got float"),
        ("meta:total_steps=-1", "total_steps -1 is outside"),
        ("meta:sampler.uinteger", "uinteger must be an integer in 0..2**32-1"),
        ("meta:sampler.state", "state.state and state.inc must be integers"),
        ("meta:recent_losses", "recent_losses must be a list of finite numbers"),
        ("meta:config.d_model", "d_model must be <= 1,024"),
        ("meta:config.lr", "lr must be a number, got str"),
        ("meta:config", "the saved config is missing or not a mapping"),
        ("meta:version", "checkpoint version 99"),
        ("meta:not-json", "unreadable checkpoint"),
        ("nan-params", "params holds non-finite values"),
        ("huge-array", "params.npy has shape (1000000000000,) float32, expected (4192,)"),
        ("object-array", "holds Python objects"),
        ("short-array", "params.npy is truncated"),
    ],
)
def test_damaged_checkpoints_are_one_line(run_copy: Path, damage: str, fragment: str) -> None:
    path = run_copy / "checkpoint.npz"
    meta = _meta(path)
    tampering = {
        "meta:step=NaN": lambda m: json.dumps(m).replace('"step": 100', '"step": NaN'),
        "meta:step=huge": _tampered_meta("step", 10**30),
        "meta:step=str": _tampered_meta("step", "100"),
        "meta:step=float": _tampered_meta("step", 100.0),
        "meta:total_steps=-1": _tampered_meta("total_steps", -1),
        "meta:sampler.uinteger": _tampered_meta("sampler.uinteger", 2**40),
        "meta:sampler.state": _tampered_meta("sampler.state", {"state": 2**200, "inc": 1}),
        "meta:recent_losses": _tampered_meta("recent_losses", [1.0, "x"]),
        "meta:config.d_model": _tampered_meta("config.d_model", 10**6),
        "meta:config.lr": _tampered_meta("config.lr", "fast"),
        "meta:config": _tampered_meta("config", [1, 2]),
        "meta:version": _tampered_meta("version", 99),
        "meta:not-json": lambda m: "{not json",
    }
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "npy":
        path.write_bytes(_npy(np.zeros(4192, np.float32)))
    elif damage in tampering:
        _rewrite(path, tampering[damage](meta))
    elif damage == "nan-params":
        params = np.load(io.BytesIO(_members(path)["params.npy"]))
        params[7] = np.nan
        _rewrite(path, params=_npy(params))
    elif damage == "huge-array":
        _rewrite(path, params=_huge_header_npy(10**12))
    elif damage == "object-array":
        _rewrite(path, params=b"\x93NUMPY\x01\x00" + _object_header())
    elif damage == "short-array":
        _rewrite(path, params=_npy(np.zeros(4192, np.float32))[:-100])
    assert_one_line_error(run("sample", str(run_copy)), str(path), fragment)
    assert_one_line_error(run("train", "--resume", str(run_copy)), str(path), fragment)


def _object_header() -> bytes:
    header = "{'descr': '|O', 'fortran_order': False, 'shape': (4192,), }"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    return len(header).to_bytes(2, "little") + header.encode("latin1")


def test_a_huge_declared_array_is_refused_before_any_allocation(run_copy: Path) -> None:
    path = run_copy / "checkpoint.npz"
    _rewrite(path, params=_huge_header_npy(10**12), adam_m=_huge_header_npy(10**12))
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match="expected"):
            load_checkpoint(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert path.stat().st_size < 200_000 and peak < 5 * 2**20, peak  # the file declared 4 TB


# ------------------------------------------------------------------------------------------ resume integrity


def test_checkpoint_records_the_names_fingerprint_and_versions(half_run: Path, names_file: Path) -> None:
    ckpt = load_checkpoint(half_run / "checkpoint.npz")
    assert ckpt.data_sha256 == hashlib.sha256(names_file.read_bytes()).hexdigest()
    assert ckpt.versions["eemicrogpt"] == __version__ and ckpt.versions["numpy"] == np.__version__
    assert ckpt.versions["backend"].startswith("eemicrogpt-backend-numpy ")


def test_resume_on_an_edited_names_file_is_refused_unless_asked(run_copy: Path, names_file: Path,
                                                                tmp_path: Path) -> None:
    edited = tmp_path / "names.txt"
    edited.write_text(names_file.read_text() + "zzyzx\n")
    result = run("train", "--resume", str(run_copy), "--data", str(edited))
    assert_one_line_error(result, f"data file {edited} is not the one this run trained on", "--allow-data-change")
    assert load_checkpoint(run_copy / "checkpoint.npz").state.step == 100  # untouched
    result = run("train", "--resume", str(run_copy), "--data", str(edited), "--allow-data-change")
    assert result.exit_code == 0, result.output
    assert "continuing on a different data file" in result.stdout
    assert_one_line_error(run("train", "--allow-data-change", "--data", str(names_file)),
                          "--allow-data-change only applies with --resume")


def test_a_half_written_metrics_line_does_not_block_resume(run_copy: Path, names_file: Path) -> None:
    metrics = run_copy / "metrics.jsonl"
    with metrics.open("a") as f:
        f.write('{"step": 150, "train_lo')  # the disk filled mid-line
    result = run("train", "--resume", str(run_copy), "--data", str(names_file))
    assert result.exit_code == 0, result.output
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == [100, 200, 300]


# ------------------------------------------------------------------------------------ signals and OS errors


class SignalAt(NullReporter):
    def __init__(self, step: int, signum: int) -> None:
        self.step, self.signum, self.sent_at, self.messages = step, signum, None, []

    def progress(self, step: int, total: int, train_loss: float) -> None:
        if step >= self.step and self.sent_at is None:
            self.sent_at = step
            os.kill(os.getpid(), self.signum)

    def message(self, text: str) -> None:
        self.messages.append(text)


def _short_cfg(names_file: Path, tmp_path: Path) -> TrainConfig:
    return TrainConfig(d_model=16, steps=60, lr=0.01, backend="numpy_ref", data=str(names_file), log_every=30,
                       chunk_steps=25, eval_batches=4, out=str(tmp_path / "run"))


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_save_like_ctrl_c(signame: str, registry: BackendRegistry, names_file: Path,
                                             tmp_path: Path) -> None:
    signum = getattr(signal, signame)
    cfg = _short_cfg(names_file, tmp_path)
    run_dir = RunDir.create(cfg.out, cfg)
    reporter = SignalAt(25, signum)
    result = train(cfg, registry, run_dir=run_dir, reporter=reporter)
    assert result.interrupted and result.stop_signal == signum and result.steps_run == reporter.sent_at
    assert load_checkpoint(run_dir.checkpoint_path).state.step == reporter.sent_at
    assert any(m.startswith(f"{signame}: stopping") for m in reporter.messages)
    assert signal.getsignal(signum) is signal.SIG_DFL  # restored


def test_an_inherited_sig_ign_is_respected(registry: BackendRegistry, names_file: Path, tmp_path: Path) -> None:
    cfg = _short_cfg(names_file, tmp_path)
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        result = train(cfg, registry, run_dir=RunDir.create(cfg.out, cfg), reporter=SignalAt(25, signal.SIGHUP))
        assert not result.interrupted and result.steps_run == 60
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_sigterm_to_the_cli_saves_and_exits_143(names_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, "train", "--backend", "numpy_ref",
         "--data", str(names_file), "--d-model", "16", "--steps", "100000", "--log-every", "20", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 120
    while not (out / "checkpoint.npz").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "SIGTERM: stopping after this chunk" in stdout and f"resume with: eemicrogpt train --resume {out}" in stdout
    assert "Traceback" not in stderr
    assert load_checkpoint(out / "checkpoint.npz").state.step > 0


def test_out_under_a_file_is_one_line(names_file: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = run("train", "--backend", "numpy_ref", "--data", str(names_file), "--out", str(blocker / "run"))
    assert_one_line_error(result, "cannot create the run directory", str(blocker / "run"), "is a file")
    result = run("train", "--backend", "numpy_ref", "--data", str(names_file), "--out", str(blocker))
    assert_one_line_error(result, f"--out {blocker} exists and is not a directory")


def test_os_and_memory_errors_no_module_names_still_end_in_one_line(half_run: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(path: Path) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(cli, "load_checkpoint", denied)
    assert_one_line_error(run("sample", str(half_run)), f"cannot access {half_run / 'checkpoint.npz'}",
                          "Permission denied", "fix the permissions")

    def exhausted(path: Path) -> None:
        raise MemoryError

    monkeypatch.setattr(cli, "load_checkpoint", exhausted)
    assert_one_line_error(run("sample", str(half_run)), "out of memory; lower d_model")


def test_missing_parent_folders_of_out_are_created(names_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "a" / "b" / "run"
    result = run("train", "--backend", "numpy_ref", "--data", str(names_file), *TINY, "--steps", "100",
                 "--out", str(out))
    assert result.exit_code == 0, result.output
    assert (out / "checkpoint.npz").is_file()


def test_disk_full_at_a_checkpoint_keeps_the_previous_one(names_file: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    real, calls = checkpoint.atomic_write_bytes, []

    def full_on_second(path: Path, data: bytes) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, data)

    monkeypatch.setattr(checkpoint, "atomic_write_bytes", full_on_second)
    out = tmp_path / "run"
    result = run("train", "--backend", "numpy_ref", "--data", str(names_file), *TINY, "--steps", "300",
                 "--out", str(out))
    assert_one_line_error(result, "cannot save the checkpoint", "No space left on device", "free some disk space",
                          "the checkpoint of step 100 is kept")
    assert load_checkpoint(out / "checkpoint.npz").state.step == 100


@pytest.fixture
def tmpfs(tmp_path: Path):
    """A 96 KiB tmpfs (root and mount(2) permitted); yields a mount function taking extra options."""
    mounts: list[Path] = []

    def mount(options: str) -> Path:
        if os.geteuid() != 0 or shutil.which("mount") is None:
            pytest.skip("mounting a tmpfs needs root; the monkeypatched disk-full test covers the logic")
        point = tmp_path / f"mnt{len(mounts)}"
        point.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size=96k,{options}", "tmpfs", str(point)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
        mounts.append(point)
        return point

    yield mount
    for point in mounts:
        subprocess.run(["umount", str(point)], check=False)


def test_a_really_full_disk_keeps_the_previous_checkpoint(tmpfs, names_file: Path) -> None:
    """96 KiB hold one d16 checkpoint (~51 KB) but not a second beside it during the atomic rename."""
    out = tmpfs("mode=0755") / "run"
    result = run("train", "--backend", "numpy_ref", "--data", str(names_file), *TINY, "--steps", "300",
                 "--out", str(out))
    assert_one_line_error(result, "No space left on device", "the checkpoint of step 100 is kept")
    assert load_checkpoint(out / "checkpoint.npz").state.step == 100
    assert sorted(p.name for p in out.iterdir()) == [".eemicrogpt-run", ".lock", "checkpoint.npz", "config.yaml",
                                                     "metrics.jsonl"]


def test_a_read_only_location_is_one_line(tmpfs, names_file: Path) -> None:
    out = tmpfs("ro") / "run"
    result = run("train", "--backend", "numpy_ref", "--data", str(names_file), "--out", str(out))
    assert_one_line_error(result, "cannot create the run directory", "Read-only file system")


def test_an_unwritable_cache_is_one_line(names_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setattr(datafile, "urllib_fetch", lambda url: names_file.read_bytes())
    result = run("train", "--backend", "numpy_ref", "--out", str(tmp_path / "r"),
                 env={"EEMICROGPT_CACHE_DIR": str(blocker / "cache")})
    assert_one_line_error(result, "cannot write the download cache", "EEMICROGPT_CACHE_DIR", "--data PATH")


def test_the_directory_is_fsynced_after_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[bool] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.path.isdir(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd") else True)
        real_fsync(fd)

    monkeypatch.setattr(atomic.os, "fsync", spy)
    atomic.atomic_write_text(tmp_path / "f.txt", "hello")
    assert synced == [False, True]  # the file's data, then the directory holding the new name


def test_two_runs_never_share_a_run_directory(names_file: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    first = RunDir.create(str(out), TrainConfig())
    first.claim()
    try:
        result = run("train", "--backend", "numpy_ref", "--data", str(names_file), "--out", str(out))
        assert_one_line_error(result, f"{out} is in use by another eemicrogpt run")
    finally:
        first.release()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(time, "strftime", lambda fmt: "20260101-000000")
    a, b = RunDir.create(None, TrainConfig()), RunDir.create(None, TrainConfig())
    assert a.path != b.path and a.path.is_dir() and b.path.is_dir()


# ------------------------------------------------------------------------------------------------- values


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--d-model", "2048"], "d_model must be <= 1,024, got 2,048"),
        (["--batch", "100000"], "batch must be <= 4,096"),
        (["--steps", "1000000000"], "steps must be <= 100,000,000"),
        (["--seed", "-1"], "seed must be >= 0, got -1"),
        (["--seed", str(2**64)], "seed must be <= "),
        (["--lr", "nan"], "lr must be a finite number"),
        (["--time-budget", "inf"], "time_budget must be a finite number in (0, 604,800], got inf"),
        (["--out", "~no_such_user_eemicrogpt/run"], "cannot expand ~no_such_user_eemicrogpt (no such user)"),
    ],
)
def test_train_values_out_of_range_are_one_line(args: list[str], fragment: str, names_file: Path) -> None:
    assert_one_line_error(run("train", "--backend", "numpy_ref", "--data", str(names_file), *args), fragment)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["-n", "2000000"], "-n must be in 1..1,000,000, got 2,000,000"),
        (["-n", "0"], "-n must be in 1..1,000,000"),
        (["--temperature", "5e-324", "--top-k", "0"], "--top-k must be >= 1"),
        (["--top-k", "28"], "top-k must be 1..27 (the model's vocabulary), got 28"),
        (["--top-p", "0"], "--top-p must be in (0, 1], got 0.0"),
        (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
        (["--prompt", "emma"], "--prompt is not for this run: it was trained on a list of names; use --prefix"),
        (["--max-new-tokens", "10"], "--max-new-tokens is not for this run"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be in 1..1,000,000"),
        (["--max-new-tokens", "1000000000"], "--max-new-tokens must be in 1..1,000,000"),
        (["--seed", "-3"], "--seed must be >= 0"),
        (["--temperature", "inf"], "--temperature must be a finite number >= 0 (0: greedy), got inf"),
        (["--temperature", "-0.5"], "--temperature must be a finite number >= 0"),
        (["--max-len", "17"], "max length must be 1..16 (the model's context), got 17"),
        (["--max-len", "0"], "max length must be 1..16"),
        (["--prefix", "Jo"], "the prefix's character 'J' is not in the model's vocabulary"),
        (["--prefix", "abcdefghijklmnop"], "the prefix has 16 characters"),
    ],
)
def test_sample_values_out_of_range_are_one_line(args: list[str], fragment: str, half_run: Path) -> None:
    assert_one_line_error(run("sample", str(half_run), *args), fragment)


def test_tilde_paths_are_expanded(names_file: Path, tmp_path: Path) -> None:
    result = run("train", "--backend", "numpy_ref", "--data", str(names_file), *TINY, "--steps", "100",
                 "--out", "~/myrun", env={"HOME": str(tmp_path)})
    assert result.exit_code == 0, result.output
    assert (tmp_path / "myrun" / "checkpoint.npz").is_file()
    result = run("sample", "~/myrun", "-n", "3", env={"HOME": str(tmp_path)})
    assert result.exit_code == 0 and len(result.stdout.splitlines()) == 3  # an empty name is an empty line


def test_memory_estimate_refuses_what_the_machine_cannot_hold() -> None:
    big = TrainConfig(d_model=1024, n_heads=8, batch=4096, chunk_steps=10_000)
    with pytest.raises(ConfigError, match=r"needs about .* GiB .* the machine has 1.0 GiB; lower d_model"):
        check_memory(big, available=2**30)
    check_memory(TrainConfig(), available=2**30)  # the default run fits in 1 GiB easily


def test_memory_estimate_follows_the_dtype_and_admits_nanogpts_shape_on_24_gib() -> None:
    full = TrainConfig(d_model=384, n_heads=6, n_layers=6, context=256, batch=64)  # shakespeare_char's model
    check_memory(full, available=24 * 2**30)
    wide = dataclasses.replace(full, dtype="float64")
    assert 1.9 < estimated_bytes(wide) / estimated_bytes(full) <= 2.0
    with pytest.raises(ConfigError, match=r"needs about 2\d\.\d GiB .* lower d_model, batch, context"):
        check_memory(wide, available=24 * 2**30)
    assert re.fullmatch(r"memory: about \d+\.\d GiB at most \(estimated; the machine has 24\.0 GiB\)",
                        describe_estimate(full, 65, available=24 * 2**30))


def test_a_backend_that_runs_blocks_is_estimated_by_its_blocks() -> None:
    # GPT-2 small's depth at d1024 and nanoGPT's full context and batch: the whole batch's activations would not
    # fit 24 GiB, x86's blocks of 240 rows on 2 threads do.
    big = TrainConfig(d_model=1024, n_heads=16, n_layers=12, context=256, batch=64, threads=2)
    with pytest.raises(ConfigError, match="lower d_model, batch"):
        check_memory(big, available=24 * 2**30)
    check_memory(big, available=24 * 2**30, block_rows=240)
    assert estimated_bytes(big, 65, block_rows=240) < estimated_bytes(big, 65) / 5
    assert "8.5 GiB" in describe_estimate(big, 65, available=24 * 2**30, block_rows=240)
    # Blocks never count more than the batch holds, and a longer context makes a block one whole sequence.
    small = dataclasses.replace(big, batch=1)
    assert estimated_bytes(small, 65, block_rows=240) == estimated_bytes(small, 65)
    assert estimated_bytes(big, 65, block_rows=8) == estimated_bytes(big, 65, block_rows=257)
    # A backend whose blocks may grow to block_bytes (x86 above d256) is counted with the larger of a block's
    # rows and those bytes, per thread and twice over, never more than the whole batch: 8,000 bytes a position
    # here (4,000 twice over).
    run = TrainConfig(batch=64, threads=2)
    assert activation_bytes(run, 257, 1000, 240) == 2 * 257 * 8000
    assert activation_bytes(run, 257, 1000, 240, block_bytes=10**7) == 2 * 2 * 10**7
    assert activation_bytes(run, 257, 1000, 240, block_bytes=10**9) == 64 * 257 * 8000
    assert activation_bytes(run, 257, 1000, WHOLE_BATCH, block_bytes=10**7) == 64 * 257 * 8000


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("log_every: 1:30\n", "'1:30' reads differently in YAML 1.1 and 1.2"),
        ("seed: 010\n", "'010' reads differently"),
        ("steps: 1_000\n", "'1_000' reads differently"),
        ("base: &b 10\nsteps: *b\n", "aliases (*name) are not allowed"),
        ("drop_invalid: yes\n", "drop_invalid must be true or false, got str 'yes'"),
    ],
)
def test_yaml_11_traps_are_refused(text: str, fragment: str, names_file: Path, tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(text)
    assert_one_line_error(run("train", "--config", str(config), "--data", str(names_file)), str(config), fragment)


def test_an_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    lines = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(9)]
    config = tmp_path / "bomb.yaml"
    config.write_text("\n".join(lines) + "\n")
    t0 = time.perf_counter()
    assert_one_line_error(run("train", "--config", str(config)), "aliases (*name) are not allowed")
    assert time.perf_counter() - t0 < 30  # generous: it fails at the first alias, long before 9**10 nodes


def test_yaml_12_numbers_are_numbers(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("lr: 1e-3\nsteps: 2000\nval_fraction: .2\n")
    cfg = load_config(config)
    assert cfg.lr == 0.001 and cfg.steps == 2000 and cfg.val_fraction == 0.2


# ------------------------------------------------------------------------------------------------ threads


class _BlockingSession:
    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def get_state(self) -> TrainState:
        self.entered.set()
        self.release.wait(10)
        return TrainState.fresh(np.zeros(3, np.float32))

    def close(self) -> None:
        pass


def test_a_session_refuses_a_second_thread_while_busy() -> None:
    inner = _BlockingSession()
    session = ValidatedSession(inner, ModelShape(16), 16, "blocking")  # type: ignore[arg-type]
    worker = threading.Thread(target=session.get_state)
    worker.start()
    assert inner.entered.wait(10)
    with pytest.raises(SessionBusyError, match=r"in use by another thread; .* open one session per thread"):
        session.get_state()
    with pytest.raises(SessionBusyError):
        session.close()
    inner.release.set()
    worker.join(10)
    session.get_state()  # free again once the first call returned
    session.close()


@pytest.mark.parametrize(("backend", "steps"), [("avx512", 4000), ("avx2", 4000), ("numpy_ref", 300)])
def test_a_real_session_used_from_two_threads_is_refused_not_corrupted(backend: str, steps: int,
                                                                        registry: BackendRegistry,
                                                                        names_file: Path) -> None:
    """cffi releases the GIL inside C: a second thread's call must be refused, not run on the shared buffers."""
    if backend not in backends_here(registry, (backend,)):
        pytest.skip(f"{backend} cannot run on this CPU")
    shape = ModelShape(16)
    data = encode(read_names(names_file).names[:500], Vocabulary.names(), DEFAULT_CONTEXT)[0]
    tokens, lengths = BatchSampler(data, 16, seed=1).sample(steps)
    lrs = np.full(steps, 0.001, np.float32)
    with open_session(registry.get(backend), shape, 16) as session:
        session.set_state(TrainState.fresh(init_params(shape, 0)))
        worker = threading.Thread(target=session.train_steps, args=(tokens, lengths, lrs))
        worker.start()
        deadline = time.monotonic() + 30
        while not session._busy.locked() and worker.is_alive() and time.monotonic() < deadline:
            time.sleep(0)
        refused = accepted = 0
        while worker.is_alive():
            try:
                session.train_steps(tokens[:1], lengths[:1], lrs[:1])
                accepted += 1  # only possible in the instant after the worker's call returned
            except SessionBusyError:
                refused += 1
        worker.join()
        assert refused >= 1, "the worker's call was never observed in progress"
        assert session.get_state().step == steps + accepted
