"""Shared fixtures. The names file is never in the repository: it is found as the program finds it
($EEMICROGPT_DATA, ../shared/data/names.txt beside a checkout, the verified download cache)."""

from __future__ import annotations

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
