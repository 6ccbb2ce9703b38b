"""Faults around the user's files: paths that lead elsewhere, forged ownership markers, outputs over existing
files and reads without a bound. Each is driven through the CLI and the Python API as a user would drive it;
"the user's files" are checked byte for byte afterwards."""

from __future__ import annotations

import errno
import os
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_checks import one_line_error
from typer.testing import CliRunner

import eemicrogpt
from eemicrogpt_core.base.errors import EemicrogptError
from eemicrogpt_core.interface import cli
from eemicrogpt_core.training.config import TrainConfig
from eemicrogpt_core.training.rundir import LOCK_NAME, MARKER_NAME, RunDir

RUNNER = CliRunner()
TINY = ["--backend", "numpy_ref", "--d-model", "16", "--steps", "20", "--log-every", "10", "--eval-batches", "2"]
API_TINY: dict[str, Any] = {"backend": "numpy_ref", "d_model": 16, "steps": 20, "log_every": 10, "eval_batches": 2,
                            "progress": False}


def run(*args: str) -> Any:
    return RUNNER.invoke(cli.app, list(args), env={"EEMICROGPT_BACKEND": None})


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every entry below directory (files by content, directories and links by name), to compare after."""
    out: dict[str, bytes] = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = Path(root) / name
            key = str(path.relative_to(directory))
            out[key] = b"<link>" if path.is_symlink() else b"<dir>" if path.is_dir() else path.read_bytes()
    return out


def users_dir(path: Path, **files: bytes) -> Path:
    path.mkdir()
    for name, data in files.items():
        (path / name).write_bytes(data)
    return path


USER_FILES = {"config.yaml": b"d_model: 16  # my notes\n", "metrics.jsonl": b'{"mine": true}\n'}


# ------------------------------------------------------------------------------------ 1. paths that lead elsewhere


@pytest.mark.parametrize("tail", ["sub/..", "sub/deeper/../..", "./sub/../."])
def test_out_through_dot_dot_is_judged_where_it_leads(tail: str, names_file: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`--out ud8/sub/..` is ud8, the user's: refused, and no `sub` is created on the way."""
    monkeypatch.chdir(tmp_path)
    users_dir(tmp_path / "ud8", **USER_FILES)
    before = snapshot(tmp_path)
    one_line_error(run("train", *TINY, "--data", str(names_file), "--out", f"ud8/{tail}"),
                   f"--out {tmp_path / 'ud8'} is not empty and was not made by eemicrogpt")
    assert snapshot(tmp_path) == before


def test_the_api_out_through_dot_dot_is_refused_too(names_file: Path, tmp_path: Path) -> None:
    users_dir(tmp_path / "ud8", **USER_FILES)
    before = snapshot(tmp_path)
    with pytest.raises(EemicrogptError, match="is not empty and was not made by eemicrogpt") as caught:
        eemicrogpt.train(data=names_file, out=str(tmp_path / "ud8" / "sub" / ".."), **API_TINY)
    assert str(caught.value).startswith(f"out {tmp_path / 'ud8'} is not empty"), caught.value  # the keyword, not --out
    assert snapshot(tmp_path) == before


def test_out_through_dot_dot_into_a_new_place_works(names_file: Path, tmp_path: Path) -> None:
    """A `..` that leads to a new directory is an ordinary new run there; the missing `new` is not made."""
    result = run("train", *TINY, "--data", str(names_file), "--out", str(tmp_path / "new" / ".." / "fresh"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "fresh" / "checkpoint.npz").is_file() and not (tmp_path / "new").exists()


# --------------------------------------------------------------------------------- 2. a marker anyone can forge


@pytest.mark.parametrize("forged", [
    {LOCK_NAME: b""},  # the old marker: a generic name anyone's tool may leave
    {MARKER_NAME: b""},  # our name, empty
    {MARKER_NAME: b"eemicrogpt run directory\n"},  # our name, other content
])
def test_a_forged_marker_does_not_make_a_directory_ours(forged: dict[str, bytes], names_file: Path,
                                                        tmp_path: Path) -> None:
    mine = users_dir(tmp_path / "u", **USER_FILES, **forged)
    before = snapshot(mine)
    one_line_error(run("train", *TINY, "--data", str(names_file), "--out", str(mine)), "was not made by eemicrogpt")
    with pytest.raises(EemicrogptError, match="was not made by eemicrogpt"):
        eemicrogpt.train(data=names_file, out=str(mine), **API_TINY)
    assert snapshot(mine) == before


def test_a_marker_copied_from_another_run_does_not_count(names_file: Path, tmp_path: Path) -> None:
    """The marker names its own directory (by inode): copied beside the user's files it marks nothing."""
    ours = RunDir.create(str(tmp_path / "ours"), TrainConfig())
    mine = users_dir(tmp_path / "u", **USER_FILES)
    shutil.copy(ours.path / MARKER_NAME, mine / MARKER_NAME)
    before = snapshot(mine)
    one_line_error(run("train", *TINY, "--data", str(names_file), "--out", str(mine)), "was not made by eemicrogpt")
    assert snapshot(mine) == before


def test_a_marked_directory_that_never_saved_is_reused(names_file: Path, tmp_path: Path) -> None:
    """A run killed before its first checkpoint leaves a marked directory: the next run may take it."""
    crashed = RunDir.create(str(tmp_path / "crashed"), TrainConfig())
    (crashed.path / "metrics.jsonl").write_text('{"step": 1}\n')
    assert run("train", *TINY, "--data", str(names_file), "--out", str(crashed.path)).exit_code == 0
    assert (crashed.path / "checkpoint.npz").is_file()


def test_a_refused_sweep_leaves_no_marker(names_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`sweep --out new/../ud4` is refused (ud4 is the user's) and leaves neither a .lock nor `new`; then a
    train into ud4 is refused as well."""
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"base": {"d_model": 16, "backend": "numpy_ref"}, "grid": {"lr": [0.01]},
                                    "steps": 5}))
    users_dir(tmp_path / "ud4", **USER_FILES)
    before = snapshot(tmp_path)
    for out in ("new/../ud4", "ud4"):
        one_line_error(run("sweep", str(spec), "--out", out, "--data", str(names_file)), "is not a sweep directory")
    assert snapshot(tmp_path) == before
    one_line_error(run("train", *TINY, "--data", str(names_file), "--out", "ud4"), "was not made by eemicrogpt")
    assert snapshot(tmp_path) == before


def test_a_legacy_run_directory_still_resumes(names_file: Path, tmp_path: Path) -> None:
    """Earlier versions marked a run with an empty .lock; such a run (a checkpoint beside it) resumes."""
    out = tmp_path / "old"
    result = run("train", *TINY, "--data", str(names_file), "--out", str(out))
    assert result.exit_code == 0, result.output
    (out / MARKER_NAME).unlink()
    (out / LOCK_NAME).write_bytes(b"")
    result = run("train", "--resume", str(out), "--steps", "30", "--data", str(names_file))
    assert result.exit_code == 0, result.output
    assert "done: step 30/30" in result.output


# ----------------------------------------------------------------------------------- 4. reads without a bound


def _in_time(action: Callable[[], Any], seconds: float = 60) -> Any:
    """Run action in a thread so that a read which blocks (a FIFO) fails the test instead of hanging it."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = action()
        except BaseException as e:  # handed back to the test thread
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the command blocked"
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "dir"])
def test_config_and_spec_must_be_regular_files(special: str, fifo: Path, tmp_path: Path) -> None:
    path = {"/dev/zero": "/dev/zero", "fifo": str(fifo), "dir": str(tmp_path)}[special]
    kind = {"/dev/zero": "a device", "fifo": "a FIFO (named pipe)", "dir": "a directory"}[special]
    one_line_error(_in_time(lambda: run("train", "--config", path, "--out", str(tmp_path / "r"))),
                   f"{path}: the config file is {kind}; give the path of a regular file")
    one_line_error(_in_time(lambda: run("sweep", path, "--out", str(tmp_path / "s"))),
                   f"{path}: the sweep spec is {kind}")
    with pytest.raises(EemicrogptError, match=re.escape(f"the config file is {kind}")):
        _in_time(lambda: eemicrogpt.train(path, **API_TINY))
    assert not (tmp_path / "r").exists() and not (tmp_path / "s").exists()


def test_a_fifo_as_data_is_refused_at_once(fifo: Path, tmp_path: Path) -> None:
    one_line_error(_in_time(lambda: run("train", *TINY, "--data", str(fifo), "--out", str(tmp_path / "r"))),
                   "the names file is a FIFO (named pipe)")


@pytest.fixture(scope="module")
def tiny_text_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A text run (its prompt file is read), trained on a few lines written here."""
    where = tmp_path_factory.mktemp("text")
    (where / "text.txt").write_text("to be, or not to be: that is the question.\n" * 200)
    result = run("train", *TINY, "--text", "--data", str(where / "text.txt"), "--out", str(where / "run"))
    assert result.exit_code == 0, result.output
    return where / "run"


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "dir"])
def test_a_prompt_file_must_be_a_regular_file(special: str, tiny_text_run: Path, fifo: Path, tmp_path: Path) -> None:
    """A FIFO without a writer as --prompt-file blocked the read forever, silently; a device or a directory is
    refused as the other files given by path are, and a missing file is named as missing."""
    path = {"/dev/zero": "/dev/zero", "fifo": str(fifo), "dir": str(tmp_path)}[special]
    kind = {"/dev/zero": "a device", "fifo": "a FIFO (named pipe)", "dir": "a directory"}[special]
    args = ["sample", str(tiny_text_run), "--max-new-tokens", "5", "--out", str(tmp_path / "s.txt")]
    one_line_error(_in_time(lambda: run(*args, "--prompt-file", path)),
                   f"{path}: the prompt file is {kind}; give the path of a regular file")
    one_line_error(run(*args, "--prompt-file", str(tmp_path / "missing.txt")),
                   f"prompt file not found: {tmp_path / 'missing.txt'}")
    assert not (tmp_path / "s.txt").exists()
    (tmp_path / "prompt.txt").write_text("to be")
    result = run(*args, "--prompt-file", str(tmp_path / "prompt.txt"), "--seed", "1")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "s.txt").read_text().startswith("to be")


def test_a_growing_config_is_bounded_by_the_bytes_read(tmp_path: Path) -> None:
    """A config larger than its bound is refused by what was read (a file's st_size is not trusted)."""
    big = tmp_path / "big.yaml"
    big.write_bytes(b"# " + b"x" * (2 << 20) + b"\n")
    one_line_error(run("train", "--config", str(big)), "holds more than 1,048,576 bytes")


@pytest.mark.parametrize("target", ["/dev/zero", "fifo"])
def test_a_metrics_log_that_is_not_a_file_is_refused(target: str, tiny_run_copy: Path, fifo: Path, tmp_path: Path,
                                                      names_file: Path) -> None:
    """metrics.jsonl linked to /dev/zero or a FIFO: resume, plot and load refuse it in one line, at once."""
    (tiny_run_copy / "metrics.jsonl").unlink()
    (tiny_run_copy / "metrics.jsonl").symlink_to(target if target != "fifo" else fifo)
    kind = "a device" if target == "/dev/zero" else "a FIFO (named pipe)"
    expected = f"the metrics log is {kind}"
    resume = ("train", "--resume", str(tiny_run_copy), "--steps", "30", "--data", str(names_file))
    one_line_error(_in_time(lambda: run(*resume)), expected)
    one_line_error(_in_time(lambda: run("plot", str(tiny_run_copy), "--out", str(tmp_path / "plots"))), expected)
    with pytest.raises(EemicrogptError, match=re.escape(expected)):
        _in_time(lambda: eemicrogpt.load(tiny_run_copy))


def test_a_huge_metrics_log_is_refused_by_its_bound(tiny_run_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from eemicrogpt_core.training import rundir

    monkeypatch.setattr(rundir, "MAX_METRICS_BYTES", 100)
    with pytest.raises(EemicrogptError, match="the metrics log holds more than 100 bytes"):
        eemicrogpt.load(tiny_run_copy)


@pytest.mark.parametrize("target", ["/dev/zero", "fifo"])
def test_a_checkpoint_that_is_not_a_file_is_refused(target: str, tiny_run_copy: Path, fifo: Path,
                                                    tmp_path: Path) -> None:
    (tiny_run_copy / "checkpoint.npz").unlink()
    (tiny_run_copy / "checkpoint.npz").symlink_to(target if target != "fifo" else fifo)
    # RunDir.existing wants a file: a FIFO or device checkpoint is refused by its kind wherever it is read.
    export = ["export", str(tiny_run_copy), "--out", str(tmp_path / "w.safetensors")]
    kind = "a device" if target == "/dev/zero" else "a FIFO (named pipe)"
    for args in (["sample", str(tiny_run_copy)], export):  # not "has no checkpoint.npz": it has one, of a wrong kind
        one_line_error(_in_time(lambda args=args: run(*args)), f"checkpoint.npz: the checkpoint is {kind}")
    with pytest.raises(EemicrogptError, match=re.escape(f"checkpoint.npz: the checkpoint is {kind}")):
        _in_time(lambda: eemicrogpt.load(tiny_run_copy))
    assert not (tmp_path / "w.safetensors").exists()


# ---------------------------------------------------------------------------- 3. outputs written over user files


def test_plot_never_replaces_or_writes_through_what_it_did_not_make(tiny_run: Path, tmp_path: Path) -> None:
    """The trial's case: `plot RUN --out p` where p (the user's) holds loss_curves.png, or a link by that name
    to a file of the user's elsewhere."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"the user's own file\n")
    for variant in ("file", "link"):
        p = tmp_path / f"p-{variant}"
        p.mkdir()
        if variant == "file":
            (p / "loss_curves.png").write_bytes(b"my figure")
        else:
            (p / "loss_curves.png").symlink_to(victim)
        before = snapshot(tmp_path)
        one_line_error(run("plot", str(tiny_run), "--out", str(p)), f"{p / 'loss_curves.png'} already exists",
                       "not made by eemicrogpt plot")
        assert snapshot(tmp_path) == before


def test_plot_writes_new_files_into_a_users_directory_and_replaces_its_own(tiny_run: Path, tmp_path: Path) -> None:
    mine = users_dir(tmp_path / "mine", **{"notes.txt": b"mine"})
    assert run("plot", str(tiny_run), "--out", str(mine)).exit_code == 0
    assert (mine / "loss_curves.png").is_file() and (mine / "notes.txt").read_bytes() == b"mine"
    one_line_error(run("plot", str(tiny_run), "--out", str(mine)), "already exists")  # not ours to replace
    ours = tmp_path / "figures"
    assert run("plot", str(tiny_run), "--out", str(ours)).exit_code == 0
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"the user's own file\n")
    (ours / "loss_curves.png").unlink()
    (ours / "loss_curves.png").symlink_to(victim)  # planted in our directory: replaced, not followed
    assert run("plot", str(tiny_run), "--out", str(ours)).exit_code == 0
    assert victim.read_bytes() == b"the user's own file\n"
    assert not (ours / "loss_curves.png").is_symlink() and (ours / "loss_curves.png").stat().st_size > 1000


def test_sample_out_on_a_full_disk_leaves_nothing_and_the_rerun_works(tiny_run: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from eemicrogpt_core.base import atomic

    target = tmp_path / "names.txt"

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as m:
        m.setattr(atomic.os, "fsync", full)
        one_line_error(run("sample", str(tiny_run), "-n", "5", "--out", str(target)),
                       f"cannot write the samples {target}: No space left on device")
    assert sorted(tmp_path.iterdir()) == []  # no partial file, no temporary file
    result = run("sample", str(tiny_run), "-n", "5", "--out", str(target))
    assert result.exit_code == 0, result.output
    assert len(target.read_text().splitlines()) == 5


@pytest.mark.parametrize("command", ["sample", "export"])
def test_sample_and_export_refuse_an_existing_file_or_link(command: str, tiny_run: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"mine")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for target in (victim, tmp_path / "dangling"):
        before = snapshot(tmp_path)
        extra = ["-n", "3"] if command == "sample" else []
        one_line_error(run(command, str(tiny_run), *extra, "--out", str(target)), "already exists")
        assert snapshot(tmp_path) == before


def test_logs_are_never_appended_through_a_link(tiny_run_copy: Path, tmp_path: Path, names_file: Path) -> None:
    """metrics.jsonl replaced by a link to a user's file: the resume rewrites the log in place of the link (as
    it trims the records past the checkpoint) and appends to its own file, never to the user's."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes((tiny_run_copy / "metrics.jsonl").read_bytes())
    (tiny_run_copy / "metrics.jsonl").unlink()
    (tiny_run_copy / "metrics.jsonl").symlink_to(victim)
    before = victim.read_bytes()
    result = run("train", "--resume", str(tiny_run_copy), "--steps", "30", "--data", str(names_file))
    assert result.exit_code == 0, result.output
    assert victim.read_bytes() == before
    assert not (tiny_run_copy / "metrics.jsonl").is_symlink()
    assert '"step": 30' in (tiny_run_copy / "metrics.jsonl").read_text()


def test_sweep_results_are_never_appended_through_a_link(tmp_path: Path) -> None:
    from eemicrogpt_core.base.errors import StorageError
    from eemicrogpt_core.sweep.results import ResultStore

    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"mine\n")
    sweep_dir = tmp_path / "sw"
    sweep_dir.mkdir()
    (sweep_dir / "results.jsonl").symlink_to(victim)
    with pytest.raises(StorageError, match="is a symbolic link, which eemicrogpt does not write through"):
        ResultStore(sweep_dir, ["lr"]).add({"run_id": "lr=1", "lr": 1, "status": "done"})
    assert victim.read_bytes() == b"mine\n"


@pytest.mark.parametrize("command", ["sample", "export"])
def test_a_new_file_in_a_missing_folder_is_one_line_naming_it(command: str, tiny_run: Path, tmp_path: Path) -> None:
    """The folder is not created for it, and the error names the file asked for, not a temporary one."""
    target = tmp_path / "missing" / "out.file"
    one_line_error(run(command, str(tiny_run), "--out", str(target)), f"{target}: No such file or directory",
                   "a parent folder is missing")
    assert not (tmp_path / "missing").exists()
