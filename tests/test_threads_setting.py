"""The `threads` setting: its default (physical cores, SMT siblings once), the config key and the hand-off."""

from __future__ import annotations

from pathlib import Path

import pytest

from eemicrogpt_core.config import load_config
from eemicrogpt_core.errors import ConfigError
from eemicrogpt_core.threads import MAX_DEFAULT_THREADS, apply_threads, physical_cores


def _fake_sysfs(root: Path, siblings: dict[int, str]) -> Path:
    for cpu, text in siblings.items():
        topology = root / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "thread_siblings_list").write_text(text + "\n")
    return root


def test_smt_siblings_count_once(tmp_path: Path) -> None:
    sysfs = _fake_sysfs(tmp_path, {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"})
    assert physical_cores({0, 1, 2, 3}, sysfs) == 2
    assert physical_cores({0, 2}, sysfs) == 1  # both siblings of one core
    assert physical_cores({0, 1}, sysfs) == 2


def test_separate_cores_and_missing_sysfs(tmp_path: Path) -> None:
    sysfs = _fake_sysfs(tmp_path, {0: "0", 1: "1"})
    assert physical_cores({0, 1}, sysfs) == 2
    assert physical_cores({0, 1, 2}, tmp_path / "absent") == 3


def test_physical_cores_of_this_process_is_at_least_one() -> None:
    assert physical_cores() >= 1


class _Threaded:
    def __init__(self) -> None:
        self.asked: list[int] = []

    def set_threads(self, n: int) -> int:
        self.asked.append(n)
        return n


def test_apply_threads_default_request_and_unthreaded_sessions(monkeypatch: pytest.MonkeyPatch) -> None:
    session = _Threaded()
    assert apply_threads(session, 3) == 3
    monkeypatch.setattr("eemicrogpt_core.threads.physical_cores", lambda *_: 500)
    assert apply_threads(session, None) == MAX_DEFAULT_THREADS
    assert apply_threads(object(), 4) == 1  # a backend that cannot split a step


def test_config_key(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("threads: 2\n")
    assert load_config(path).threads == 2
    path.write_text("threads: null\n")
    assert load_config(path).threads is None
    path.write_text("threads: 0\n")
    with pytest.raises(ConfigError, match=r"run\.yaml: threads must be >= 1"):
        load_config(path)
