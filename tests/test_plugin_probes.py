"""Probes run only when a command needs them, a slow one is announced while it is waited on, a hung one of an
installed plugin is remembered, and choosing a backend whose plugin failed to import shows the import error.
Fixture plugins: in-process modules, and small distributions installed on sys.path for the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import types
from pathlib import Path

import pytest

from eemicrogpt_core.backends import plugin_guard, probe_memory
from eemicrogpt_core.backends.backend import BackendSpec, ProbeResult
from eemicrogpt_core.backends.hookspec import hookimpl
from eemicrogpt_core.backends.plugin_guard import TIMEOUT_ENV
from eemicrogpt_core.backends.registry import load_registry
from eemicrogpt_core.base.errors import BackendSelectionError
from eemicrogpt_core.model.shape import ModelShape

SHAPE = ModelShape(16, 4)
NEVER = threading.Event()

CLI = "from eemicrogpt_core.interface.cli import app; app()"  # the eemicrogpt command in this interpreter


def _numpy_session(shape, batch, dtype):
    from eemicrogpt_backend_numpy.session import NumpySession

    return NumpySession(shape, batch, dtype)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory of hung plugins lives in a cache directory of the test's own."""
    monkeypatch.setenv("EEMICROGPT_CACHE_DIR", str(tmp_path / "cache"))


def counting_plugin(calls: list[str]) -> types.ModuleType:
    def probe(name: str, hang: bool):
        def run() -> ProbeResult:
            calls.append(name)
            if hang:
                NEVER.wait()
            return ProbeResult.ok(5)
        return run

    module = types.ModuleType("counting")
    specs = [BackendSpec("stuck", "hangs", probe("stuck", True), _numpy_session),
             BackendSpec("fine", "answers", probe("fine", False), _numpy_session)]
    module.eemicrogpt_backends = hookimpl(lambda: specs)
    return module


def test_a_backend_chosen_by_name_probes_only_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TIMEOUT_ENV, "0.3")
    calls: list[str] = []
    reg = load_registry(entry_points=False, extra_plugins=(counting_plugin(calls),))
    assert calls == []  # loading probes nothing
    assert reg.select("fine", SHAPE, 16).name == "fine"
    assert calls == ["fine"]
    assert reg.auto_choice(SHAPE, 16).name == "fine"  # auto probes the rest (stuck: given up on)
    assert sorted(calls) == ["fine", "stuck"] and "did not return within 0.3 s" in reg.get("stuck").status_reason
    reg.available()
    assert len(calls) == 2  # each probe runs once


def test_a_slow_probe_is_announced_while_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TIMEOUT_ENV, "0.6")
    monkeypatch.setattr(plugin_guard, "SLOW_NOTICE", 0.1)
    notes: list[str] = []
    reg = load_registry(entry_points=False, extra_plugins=(counting_plugin([]),), notify=notes.append)
    reg.available()
    assert notes == [f"waiting for the probe of backend stuck: slow (each call is given up after 0.6 s, "
                     f"${TIMEOUT_ENV})"]
    assert probe_memory.recall(probe_memory.key("(in-process)", "", "x"), 1.0) is None  # in-process: never


def fake_distribution(root: Path, name: str, module: str, body: str) -> None:
    (root / f"{module}.py").write_text(textwrap.dedent(body))
    info = root / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[eemicrogpt.backends]\n{module} = {module}\n")


HANGING = """
    import threading
    from pathlib import Path
    from eemicrogpt_core.backends.backend import BackendSpec, ProbeResult
    from eemicrogpt_core.backends.hookspec import hookimpl

    def probe():
        with open({calls!r}, "a") as f:
            f.write("probed\\n")
        threading.Event().wait()

    @hookimpl
    def eemicrogpt_backends():
        yield BackendSpec("hangs", "a probe that never returns", probe, lambda s, b, d: None)
"""


@pytest.fixture
def hanging_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An installed plugin whose probe hangs; it appends a line to the returned file each time it is probed."""
    calls = tmp_path / "probed.txt"
    site = tmp_path / "site"
    site.mkdir()
    fake_distribution(site, "hanging-backend", "hanging_plug", HANGING.format(calls=str(calls)))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("EEMICROGPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(TIMEOUT_ENV, "0.3")
    yield calls
    sys.modules.pop("hanging_plug", None)


def test_a_hung_probe_is_remembered_and_not_called_again(hanging_distribution: Path) -> None:
    first = load_registry().get("hangs")
    assert "probe did not return within 0.3 s" in first.status_reason
    assert hanging_distribution.read_text().count("probed") == 1
    memory = json.loads(probe_memory.memory_path().read_text())
    assert list(memory) == ["hanging-backend 1.0: hanging_plug: probe of hangs"]

    again = load_registry().get("hangs")
    assert not again.available
    assert "did not return within 0.3 s (hung?) 0.0 h ago; not tried again for 24.0 h" in again.status_reason
    assert str(probe_memory.memory_path()) in again.status_reason
    assert hanging_distribution.read_text().count("probed") == 1  # not called a second time


def test_a_longer_deadline_tries_a_remembered_probe_again(hanging_distribution: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    assert not load_registry().get("hangs").available
    monkeypatch.setenv(TIMEOUT_ENV, "0.5")
    assert load_registry().get("hangs").error.removeprefix("probe ") == "did not return within 0.5 s (hung?)"
    assert hanging_distribution.read_text().count("probed") == 2


def test_the_memory_of_a_hang_expires() -> None:
    key = probe_memory.key("d", "1.0", "probe of x")
    probe_memory.remember(key, "did not return", 20.0, now=1000.0)
    assert probe_memory.recall(key, 20.0, now=1000.0 + 3600) is not None
    assert probe_memory.recall(key, 20.0, now=1000.0 + probe_memory.REMEMBER_SECONDS + 1) is None
    assert probe_memory.recall(key, 60.0, now=1000.0 + 3600) is None  # given longer now: tried again


def test_train_with_a_named_backend_never_probes_a_hung_plugin(hanging_distribution: Path, names_file: Path,
                                                              tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]),
           TIMEOUT_ENV: "20"}
    proc = subprocess.run([sys.executable, "-c", CLI, "train", "--backend",
                           "numpy_ref", "--data", str(names_file), "--d-model", "16", "--steps", "20", "--log-every",
                           "10", "--out", str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not hanging_distribution.exists()  # the hung probe was never started


HANGING_HOOK = """
    import threading
    from eemicrogpt_core.backends.hookspec import hookimpl

    @hookimpl
    def eemicrogpt_backends():
        with open({calls!r}, "a") as f:
            f.write("called\\n")
        threading.Event().wait()
"""


def test_a_hung_hook_is_remembered_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = tmp_path / "called.txt"
    fake_distribution(tmp_path, "hook-hangs", "hook_hangs", HANGING_HOOK.format(calls=str(calls)))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(TIMEOUT_ENV, "0.3")
    try:
        for _ in range(2):
            failure = next(f for f in load_registry().failures if f.distribution == "hook-hangs")
            assert "eemicrogpt_backends() did not return within 0.3 s" in failure.error
        assert "not tried again" in failure.error and calls.read_text().count("called") == 1
    finally:
        sys.modules.pop("hook_hangs", None)


BROKEN = """
    raise ImportError("libmissing.so.3: cannot open shared object file")
"""


def test_choosing_a_backend_whose_plugin_failed_to_import_shows_the_error(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    fake_distribution(tmp_path, "broken-backend", "broken_plug", BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        reg = load_registry()
        with pytest.raises(BackendSelectionError, match=r"backend 'fastcpu' is not provided by any plugin that "
                                                        r"loaded .*plugins that failed to load: broken_plug "
                                                        r"\(broken-backend\): import failed: ImportError: "
                                                        r"libmissing\.so\.3"):
            reg.select("fastcpu", SHAPE, 16)
    finally:
        sys.modules.pop("broken_plug", None)
