"""Shared fixtures. The names file is never in the repository: it is found as the program finds it
($EEMICROGPT_DATA, ../shared/data/names.txt beside a checkout, the verified download cache)."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest

from eemicrogpt_core.backends.registry import BackendRegistry, load_registry
from eemicrogpt_core.kit import conformance as testing

# pytester runs generated subclasses of the conformance kit (tests/test_conformance_kit.py).
pytest_plugins = ["pytester"]


def _interactive_signal_defaults() -> None:
    """Give SIGINT, SIGTERM and SIGHUP their interactive dispositions when the suite inherited them ignored.

    A test command started under `nohup` (SIGHUP ignored) or as a background job of a shell without job
    control (SIGINT ignored) passes SIG_IGN to every process it starts, and the trainer rightly keeps an
    ignored signal ignored; the tests that send these signals to a run, in this process or in the
    subprocesses they start (which inherit the disposition), test the interactive case."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)


_interactive_signal_defaults()


@pytest.fixture(scope="session")
def names_file() -> Path:
    return testing.names_file()


@pytest.fixture(scope="module")
def registry() -> BackendRegistry:
    """The installed backends; numpy_ref among them (the tests that train use it)."""
    reg = load_registry()
    entry = reg.get("numpy_ref")
    if entry is None or not entry.available:
        pytest.fail("numpy_ref must be installed for these tests: pip install ./backends/numpy_ref", pytrace=False)
    return reg


@pytest.fixture(scope="session")
def tiny_run(names_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished numpy_ref d16 run of 20 steps (checkpoints at 10 and 20), written by the CLI. Copy it
    (tiny_run_copy) before changing it."""
    from typer.testing import CliRunner

    from eemicrogpt_core.interface import cli

    out = tmp_path_factory.mktemp("tiny") / "run"
    result = CliRunner().invoke(cli.app, ["train", "--backend", "numpy_ref", "--d-model", "16", "--steps", "20",
                                          "--log-every", "10", "--eval-batches", "2", "--data", str(names_file),
                                          "--out", str(out)], env={"EEMICROGPT_BACKEND": None})
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def tiny_run_copy(tiny_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_run, tmp_path / "run"))
