"""Run files as users expect of a command-line tool: modes follow the umask, and elapsed_s keeps counting
across a resume instead of starting again at 0."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from eemicrogpt_core.backends.registry import load_registry
from eemicrogpt_core.base.atomic import atomic_write_text, process_umask
from eemicrogpt_core.kit.conformance import names_file
from eemicrogpt_core.training.checkpoint import load_checkpoint
from eemicrogpt_core.training.config import build_config
from eemicrogpt_core.training.rundir import RunDir
from eemicrogpt_core.training.trainer import train


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_written_files_follow_the_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        assert process_umask() == umask
        atomic_write_text(tmp_path / "f.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f.txt").stat().st_mode) == 0o666 & ~umask


class _StopAt:
    """A reporter that interrupts the run (as a second Ctrl-C would) once the record of `step` is logged."""

    def __init__(self, step: int) -> None:
        self.step = step

    def start(self, info: object) -> None: ...
    def progress(self, step: int, total: int, train_loss: float) -> None: ...
    def message(self, text: str) -> None: ...
    def finish(self) -> None: ...

    def log(self, record: dict) -> None:
        if record["step"] == self.step:
            raise KeyboardInterrupt


def test_elapsed_continues_across_a_resume(tmp_path: Path) -> None:
    cfg = build_config([("test", {"d_model": 16, "steps": 40, "log_every": 10, "backend": "numpy_ref",
                                  "data": str(names_file()), "out": str(tmp_path / "run")})])
    registry = load_registry()
    run = RunDir.create(cfg.out, cfg)
    stopped = train(cfg, registry, run_dir=run, reporter=_StopAt(20))
    assert stopped.interrupted and stopped.state.step == 20
    resumed = train(cfg, registry, run_dir=run, resume=load_checkpoint(run.checkpoint_path))
    assert resumed.state.step == 40
    records = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    assert [r["step"] for r in records] == [10, 20, 30, 40]
    elapsed = [r["elapsed_s"] for r in records]
    assert elapsed == sorted(elapsed) and elapsed[2] > elapsed[1] > 0, elapsed
