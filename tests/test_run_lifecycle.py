"""The three callers of the run lifecycle (training/runs.py): `eemicrogpt train`, the Python API's train() and a
sweep's run. Each bad input must end the same way in all three: the same one-line error, and no run
directory left behind (or the user's directory untouched)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import eemicrogpt
from eemicrogpt_core.backends.registry import load_registry
from eemicrogpt_core.interface import cli
from eemicrogpt_core.sweep.runner import FAILED, run_one
from eemicrogpt_core.training.checkpoint import load_checkpoint, save_checkpoint
from eemicrogpt_core.training.rundir import CHECKPOINT_NAME

TINY = {"d_model": 16, "steps": 5, "log_every": 5}


def cli_error(args: list[str]) -> str:
    result = CliRunner().invoke(cli.app, ["train", *args], env={"EEMICROGPT_BACKEND": None, "EEMICROGPT_DATA": None})
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("eemicrogpt: error: "), result.stderr
    return lines[0].removeprefix("eemicrogpt: error: ")


def api_error(keys: dict[str, Any]) -> str:
    with pytest.raises(eemicrogpt.EemicrogptError) as info:
        eemicrogpt.train(progress=False, **keys)
    return " ".join(str(info.value).split())


def sweep_error(keys: dict[str, Any], out: Path) -> str:
    record = run_one({"run_id": "r0", "config": keys, "varied": {}, "run_dir": str(out)}, load_registry())
    assert record["status"] == FAILED, record
    return str(record["error"])


def cli_args(keys: dict[str, Any]) -> list[str]:
    return [arg for key, value in keys.items() for arg in (f"--{key.replace('_', '-')}", str(value))]


def bad_inputs(tmp: Path, names_file: Path) -> dict[str, dict[str, Any]]:
    foreign = tmp / "mine"
    foreign.mkdir(exist_ok=True)
    (foreign / "notes.txt").write_text("the user's own file\n")
    many = tmp / "many.txt"  # 300 distinct characters: more than a vocabulary holds
    many.write_text("".join(f"{chr(0x100 + i)}{chr(0x100 + i)}\n" for i in range(300)), encoding="utf-8")
    return {
        "unknown backend": {"backend": "no_such_backend", "data": str(names_file)},
        "missing data file": {"backend": "numpy_ref", "data": str(tmp / "absent.txt")},
        "too many characters": {"backend": "numpy_ref", "data": str(many)},
        "foreign out directory": {"backend": "numpy_ref", "data": str(names_file), "out": str(foreign)},
    }


@pytest.mark.parametrize("case", ["unknown backend", "missing data file", "too many characters",
                                  "foreign out directory"])
def test_train_api_and_sweep_refuse_alike(case: str, tmp_path: Path, names_file: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EEMICROGPT_BACKEND", raising=False)
    monkeypatch.delenv("EEMICROGPT_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    keys = {**TINY, **bad_inputs(tmp_path, names_file)[case]}
    outs = {caller: Path(keys.get("out") or tmp_path / f"run-{caller}") for caller in ("cli", "api", "sweep")}
    before = sorted(p.name for p in tmp_path.iterdir())
    errors = {
        "cli": cli_error(cli_args({**keys, "out": outs["cli"]})),
        "api": api_error({**keys, "out": str(outs["api"])}),
        "sweep": sweep_error({k: v for k, v in keys.items() if k != "out"}, outs["sweep"]),
    }
    # The API names its keyword `out` where the command line and the sweep say `--out`: the same sentence else.
    errors["api"] = re.sub(r"(?<![-\w])out\b", "--out", errors["api"])
    assert errors["cli"] == errors["api"] == errors["sweep"], errors
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no run directory was made
    if case == "foreign out directory":
        assert sorted(p.name for p in outs["cli"].iterdir()) == ["notes.txt"]


def test_a_sweep_resume_checks_the_data_files_fingerprint(tmp_path: Path, names_file: Path) -> None:
    """A sweep run resumed on another file is refused as `train --resume` refuses it."""
    other = tmp_path / "other.txt"
    other.write_text(names_file.read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    run_dir = tmp_path / "run"
    keys = {**TINY, "backend": "numpy_ref", "data": str(names_file), "steps": 40, "log_every": 10}
    assert run_one({"run_id": "r0", "config": keys, "varied": {}, "run_dir": str(run_dir)},
                   load_registry())["status"] == "done"
    # As if it had stopped half way: a longer run whose checkpoint is at step 40 is what a sweep resumes.
    ckpt = load_checkpoint(run_dir / CHECKPOINT_NAME)
    save_checkpoint(run_dir / CHECKPOINT_NAME, dataclasses.replace(
        ckpt, total_steps=80, config=dataclasses.replace(ckpt.config, steps=80)))
    result = CliRunner().invoke(cli.app, ["train", "--resume", str(run_dir), "--data", str(other)],
                                env={"EEMICROGPT_BACKEND": None, "EEMICROGPT_DATA": None})
    assert result.exit_code == 2 and "is not the one this run trained on" in result.stderr, result.output
    on_other = {**keys, "steps": 80, "data": str(other)}
    error = sweep_error(on_other, run_dir)
    assert error == result.stderr.strip().removeprefix("eemicrogpt: error: ")
    assert load_checkpoint(run_dir / CHECKPOINT_NAME).state.step == 40  # nothing trained on the other file
