"""Faults that used to end in a traceback, a silently wrong result or a misleading message: crafted checkpoint
archives, a terminal that cannot print the vocabulary, divergence that stays finite, duplicate YAML keys,
sweep columns that share a name, and errors that named the wrong thing. Driven through the CLI (in process and
as a real subprocess where the terminal matters) and the Python API."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import struct
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from cli_checks import one_line_error
from typer.testing import CliRunner

import eemicrogpt
from eemicrogpt_core.base.errors import EemicrogptError
from eemicrogpt_core.interface import api, cli

RUNNER = CliRunner()
CLI = [sys.executable, "-c", "from eemicrogpt_core.interface.cli import app; app()"]
TINY = ["--backend", "numpy_ref", "--d-model", "16", "--steps", "20", "--log-every", "10", "--eval-batches", "2"]


def run(*args: str) -> Any:
    return RUNNER.invoke(cli.app, list(args), env={"EEMICROGPT_BACKEND": None})


# ------------------------------------------------------------------------------ 8. tracebacks from crafted zips


def _patch_member_headers(path: Path, member: str, *, flag_bits: int | None = None, method: int | None = None) -> None:
    """Set the general-purpose flags or the compression method of one member, in its local header and in the
    central directory, without touching its data (what a crafted or foreign archive looks like)."""
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
    local = info.header_offset
    assert raw[local:local + 4] == b"PK\x03\x04"
    central = raw.index(b"PK\x01\x02")
    while raw[central + 46:central + 46 + struct.unpack_from("<H", raw, central + 28)[0]] != member.encode():
        central = raw.index(b"PK\x01\x02", central + 4)  # the next central entry, until this member's
    for offset in (local + 6, central + 8):  # the flags; the method follows them
        if flag_bits is not None:
            struct.pack_into("<H", raw, offset, struct.unpack_from("<H", raw, offset)[0] | flag_bits)
        if method is not None:
            struct.pack_into("<H", raw, offset + 2, method)
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(("damage", "fragment"), [
    ({"flag_bits": 0x1}, "member params.npy is encrypted"),
    ({"method": 99}, "member params.npy uses compression method 99"),
    ({"method": 14}, "member params.npy uses compression method 14"),  # LZMA: readable, but never ours
])
def test_a_crafted_zip_member_is_one_line(damage: dict[str, int], fragment: str, tiny_run_copy: Path, tmp_path: Path,
                                          names_file: Path) -> None:
    path = tiny_run_copy / "checkpoint.npz"
    _patch_member_headers(path, "params.npy", **damage)
    for args in (["sample", str(tiny_run_copy)], ["train", "--resume", str(tiny_run_copy), "--steps", "30", "--data",
                                             str(names_file)],
                 ["export", str(tiny_run_copy), "--out", str(tmp_path / "w.safetensors")]):
        one_line_error(run(*args), str(path), fragment)
    with pytest.raises(EemicrogptError, match=re.escape(fragment)):
        eemicrogpt.load(tiny_run_copy)
    assert not (tmp_path / "w.safetensors").exists()


def test_memory_error_in_load_is_an_eemicrogpt_error(tiny_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The API promises EemicrogptError; a MemoryError while reading stays catchable as MemoryError too."""
    def no_memory(path: Path) -> Any:
        raise MemoryError

    monkeypatch.setattr(api, "load_checkpoint", no_memory)
    with pytest.raises(EemicrogptError, match=f"{tiny_run}: out of memory while loading the run") as caught:
        eemicrogpt.load(tiny_run)
    assert isinstance(caught.value, MemoryError)


# ------------------------------------------------------------------ 8. a terminal that cannot print the vocabulary


@pytest.fixture(scope="module")
def accented_names(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("accented") / "names.txt"
    path.write_text("zoé\nélise\nanna\nbob\nchloé\nmarc\n" * 40, encoding="utf-8")
    return path


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_a_terminal_without_the_vocabularys_characters_escapes_them(encoding: str, accented_names: Path,
                                                                     tmp_path: Path) -> None:
    """PYTHONIOENCODING=ascii: train and sample print \\xe9 escapes instead of dying in UnicodeEncodeError
    (which left a run directory without a checkpoint); files stay UTF-8. latin-1 has é but not the
    box-drawing characters of the progress output."""
    env = {**os.environ, "PYTHONIOENCODING": encoding, "EEMICROGPT_BACKEND": ""}
    out = tmp_path / "run"
    proc = subprocess.run([*CLI, "train", *TINY, "--data", str(accented_names), "--out", str(out)], env=env,
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert b"Traceback" not in proc.stdout + proc.stderr
    assert (out / "checkpoint.npz").is_file()
    proc = subprocess.run([*CLI, "sample", str(out), "-n", "40", "--out", str(tmp_path / "s.txt")], env=env,
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert "é" in (tmp_path / "s.txt").read_text(encoding="utf-8")
    proc = subprocess.run([*CLI, "sample", str(out), "-n", "40", "--seed", "3"], env=env, capture_output=True,
                          timeout=300)
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr.decode(errors="replace")
    printed = proc.stdout.decode(encoding)
    assert ("\\xe9" if encoding == "ascii" else "é") in printed


# --------------------------------------------------------------------------------- 9. silent wrong results


@pytest.mark.parametrize("lr", ["1e6", "3e4"])
def test_a_finite_loss_far_above_the_start_is_divergence(lr: str, names_file: Path, tmp_path: Path) -> None:
    """lr 1e6 trained to a loss of 8e18 and said "done"; the loss never overflowed, so only its size shows it."""
    out = tmp_path / "run"
    result = run("train", "--backend", "numpy_ref", "--d-model", "16", "--steps", "200", "--log-every", "100",
                 "--eval-batches", "2", "--lr", lr, "--data", str(names_file), "--out", str(out))
    line = one_line_error(result, "training diverged", "over 10x the 3.3 of a uniform guess", "try a lower --lr")
    assert "by step 100" in line or "non-finite" in line or "became" in line, line
    assert not (out / "checkpoint.npz").exists()
    with pytest.raises(EemicrogptError, match="training diverged"):
        eemicrogpt.train(data=names_file, backend="numpy_ref", d_model=16, steps=200, log_every=100, eval_batches=2,
                         lr=float(lr), out=str(tmp_path / "api"), progress=False)


def test_a_diverging_sweep_run_is_recorded_as_failed(names_file: Path, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"base": {"d_model": 16, "backend": "numpy_ref", "log_every": 50,
                                             "eval_batches": 2}, "grid": {"lr": [0.01, 1e6]}, "steps": 100}))
    result = run("sweep", str(spec), "--out", str(tmp_path / "sw"), "--data", str(names_file), "--workers", "1")
    assert result.exit_code == 1, result.output
    records = [json.loads(line) for line in (tmp_path / "sw" / "results.jsonl").read_text().splitlines()]
    by_lr = {r["lr"]: r for r in records}
    assert by_lr[0.01]["status"] == "done"
    assert by_lr[1e6]["status"] == "failed" and "training diverged" in by_lr[1e6]["error"]


@pytest.mark.parametrize(("text", "fragment"), [
    ("lr: 0.01\nsteps: 5\nlr: 0.02\n", ":3: malformed YAML: key 'lr' is given twice (lines 1 and 3)"),
    ("d_model: 16\nd_model: 32\n", ":2: malformed YAML: key 'd_model' is given twice (lines 1 and 2)"),
])
def test_duplicate_config_keys_are_refused(text: str, fragment: str, tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    one_line_error(run("train", "--config", str(path), "--out", str(tmp_path / "r")), str(path) + fragment)
    with pytest.raises(EemicrogptError, match="is given twice"):
        eemicrogpt.train(path, progress=False)
    assert not (tmp_path / "r").exists()


def test_duplicate_keys_in_a_sweep_spec_are_refused_even_nested(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("base:\n  d_model: 16\n  lr: 0.01\n  lr: 0.02\ngrid:\n  seed: [1, 2]\n")
    one_line_error(run("sweep", str(path), "--out", str(tmp_path / "sw")),
                   f"{path}:4: malformed YAML: key 'lr' is given twice (lines 3 and 4)")
    assert not (tmp_path / "sw").exists()


def _rewrite_meta(path: Path, change: Any) -> None:
    with zipfile.ZipFile(path) as zf:
        members = {name: zf.read(name) for name in zf.namelist()}
    meta = json.loads(str(np.load(io.BytesIO(members["meta.npy"]))))
    change(meta)
    buf = io.BytesIO()
    np.save(buf, np.array(json.dumps(meta)))
    members["meta.npy"] = buf.getvalue()
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)


@pytest.mark.parametrize("control", ["\n", "\r", "\x1b", "\t"])
def test_a_control_character_in_a_lists_symbol_table_is_refused(control: str, tiny_run_copy: Path) -> None:
    """Names are one a line of printable text (the names reader refuses control characters): a symbol table with
    "\\n" made `sample -n 2` print four lines, one with "\\r" names that overwrite each other on a terminal."""
    _rewrite_meta(tiny_run_copy / "checkpoint.npz", lambda m: m.update(symbols=sorted([control, *m["symbols"][1:]])))
    fragment = f"cannot hold control character U+{ord(control):04X}"
    one_line_error(run("sample", str(tiny_run_copy), "-n", "2"), fragment)
    with pytest.raises(EemicrogptError, match=re.escape(fragment)):
        eemicrogpt.load(tiny_run_copy)


@pytest.mark.parametrize("version", [True, False, 3.0, "3"])
def test_a_checkpoint_version_must_be_an_integer(version: Any, tiny_run_copy: Path) -> None:
    """version: true is 1 to Python (True == 1) and loaded as format 1."""
    _rewrite_meta(tiny_run_copy / "checkpoint.npz", lambda m: m.update(version=version))
    one_line_error(run("sample", str(tiny_run_copy)), f"checkpoint version {version!r}")


@pytest.mark.parametrize("swept", ["steps", "backend"])
def test_results_csv_keeps_a_swept_key_apart_from_the_outcome_of_that_name(swept: str, names_file: Path,
                                                                            tmp_path: Path) -> None:
    base = {"d_model": 16, "backend": "numpy_ref", "log_every": 10, "eval_batches": 2, "steps": 20}
    grid = {"steps": [10, 20]} if swept == "steps" else {"backend": ["numpy_ref", "auto"]}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"base": {k: v for k, v in base.items() if k not in grid}, "grid": grid}))
    result = run("sweep", str(spec), "--out", str(tmp_path / "sw"), "--data", str(names_file), "--workers", "1")
    assert result.exit_code == 0, result.output
    with (tmp_path / "sw" / "results.csv").open() as f:
        header = next(csv.reader(f))
        f.seek(0)
        rows = list(csv.DictReader(f))
    assert header.count(swept) == 1 and f"actual_{swept}" in header, header
    assert sorted(r[swept] for r in rows) == sorted(str(v) for v in grid[swept])
    if swept == "steps":
        assert all(r["steps"] == r["actual_steps"] for r in rows)  # each ran the steps it was given
    else:
        assert {r["actual_backend"] for r in rows} - {""} <= {"numpy_ref", "avx512", "avx2", "avx512_bf16", "amx_bf16"}


# ------------------------------------------------------------------------------------ 10. misleading messages


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="/dev/full (every write fails with ENOSPC) is Linux's")
@pytest.mark.parametrize("command", [["backends"], ["sample", "{run}", "-n", "50"], ["--version"]])
def test_stdout_on_a_full_device_names_standard_output(command: list[str], tiny_run: Path) -> None:
    args = [a.replace("{run}", str(tiny_run)) for a in command]
    with open("/dev/full", "w") as full:
        proc = subprocess.run([*CLI, *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    one_line_error(subprocess.CompletedProcess(proc.args, proc.returncode, "", proc.stderr),
                   "cannot write standard output: No space left on device")


def test_resume_onto_a_new_character_offers_what_resume_accepts(tiny_run_copy: Path, names_file: Path,
                                                                tmp_path: Path) -> None:
    data = tmp_path / "names.txt"
    data.write_text(names_file.read_text() + "zoé\n", encoding="utf-8")
    resume = ["train", "--resume", str(tiny_run_copy), "--steps", "30", "--data", str(data), "--allow-data-change"]
    one_line_error(run(*resume), "is not in the checkpoint's vocabulary", "--drop-invalid")
    result = run(*resume, "--drop-invalid")  # what the message offers is accepted
    assert result.exit_code == 0, result.output
    assert "done: step 30/30" in result.output


def test_api_errors_name_the_api_not_the_command_line(names_file: Path) -> None:
    with pytest.raises(EemicrogptError) as caught:
        eemicrogpt.train(data=names_file, lr=-1, progress=False)
    assert str(caught.value).startswith("train() keys: lr must be") and "command line" not in str(caught.value)


def test_load_of_a_file_says_it_is_a_file(tiny_run: Path, tmp_path: Path) -> None:
    script = tmp_path / "file.py"
    script.write_text("print(1)\n")
    with pytest.raises(EemicrogptError, match=f"{script} is a file, not a run directory"):
        eemicrogpt.load(script)
    with pytest.raises(EemicrogptError, match=f"pass its directory, {tiny_run}$"):
        eemicrogpt.load(tiny_run / "checkpoint.npz")
    one_line_error(run("sample", str(script)), "is a file, not a run directory")


def test_a_wandb_random_spec_needs_run_cap(tmp_path: Path) -> None:
    spec = tmp_path / "wandb.yaml"
    body = {"method": "random", "parameters": {"lr": {"distribution": "uniform", "min": 0.001, "max": 0.01},
                                               "d_model": {"value": 16}}}
    spec.write_text(yaml.safe_dump(body))
    one_line_error(run("sweep", str(spec), "--out", str(tmp_path / "sw")), "run_cap: a random W&B-style sweep needs "
                   "run_cap: N")
    spec.write_text(yaml.safe_dump({**body, "run_cap": 3}))
    from eemicrogpt_core.sweep.spec import expand, load_spec

    assert len(expand(load_spec(spec))) == 3
