"""The `threads` setting: its default (physical cores, capped), the config key and the hand-off."""

from __future__ import annotations

from pathlib import Path

import pytest

from eemicrogpt_core.backends.threads import MAX_DEFAULT_THREADS, apply_threads
from eemicrogpt_core.base.errors import ConfigError
from eemicrogpt_core.training.config import load_config


class _Threaded:
    def __init__(self) -> None:
        self.asked: list[int] = []

    def set_threads(self, n: int) -> int:
        self.asked.append(n)
        return n


def test_apply_threads_default_request_and_unthreaded_sessions(monkeypatch: pytest.MonkeyPatch) -> None:
    session = _Threaded()
    assert apply_threads(session, 3) == 3
    monkeypatch.setattr("eemicrogpt_core.backends.threads.physical_core_count", lambda *_: 500)
    assert apply_threads(session, None) == MAX_DEFAULT_THREADS
    assert apply_threads(object(), 4) == 1  # a backend that cannot split a step


def test_config_key(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("threads: 2\n")
    assert load_config(path).threads == 2
    path.write_text("threads: null\n")
    assert load_config(path).threads is None
    path.write_text("threads: auto\n")  # the default, written out
    assert load_config(path).threads is None
    path.write_text("threads: automatic\n")
    with pytest.raises(ConfigError, match=r"threads must be an integer"):
        load_config(path)
    path.write_text("threads: 0\n")
    with pytest.raises(ConfigError, match=r"run\.yaml: threads must be >= 1"):
        load_config(path)
