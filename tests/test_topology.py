"""CPU topology from sysfs: SMT siblings count once, only usable CPUs count, unreadable topology degrades."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from eemicrogpt_core.backends.topology import parse_cpu_list, physical_core_count, physical_cores, usable_cpus


def fake_sysfs(root: Path, siblings: dict[int, str]) -> Path:
    for cpu, text in siblings.items():
        topo = root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "thread_siblings_list").write_text(text + "\n")
    return root


def test_parse_cpu_list() -> None:
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("5") == [5]


def test_smt_siblings_count_once(tmp_path: Path) -> None:
    root = fake_sysfs(tmp_path, {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"})
    assert physical_cores({0, 1, 2, 3}, root) == [[0, 2], [1, 3]]
    assert physical_core_count({0, 1, 2, 3}, root) == 2
    assert physical_core_count({0, 2}, root) == 1  # both siblings of one core
    assert physical_core_count({0, 1}, root) == 2


def test_unreadable_topology_counts_each_cpu_as_a_core(tmp_path: Path) -> None:
    root = fake_sysfs(tmp_path, {0: "0"})
    assert physical_cores({0, 5}, root) == [[0], [5]]
    assert physical_core_count({0, 1, 2}, tmp_path / "absent") == 3


def test_only_allowed_cpus_are_used(tmp_path: Path) -> None:
    root = fake_sysfs(tmp_path, {0: "0-1", 1: "0-1", 2: "2-3", 3: "2-3"})
    assert physical_cores({1, 2, 3}, root) == [[1], [2, 3]]


def test_this_process_has_at_least_one_core() -> None:
    cores = physical_cores()
    assert cores and sorted(c for core in cores for c in core) == sorted(usable_cpus())
    assert usable_cpus() == set(os.sched_getaffinity(0))
    assert physical_core_count() == len(cores) >= 1


def test_training_does_not_load_the_sweep_feature() -> None:
    # The core's training path (registry, threads, trainer) must not depend on `eemicrogpt sweep`.
    code = ("import sys, eemicrogpt_core.backends.registry, eemicrogpt_core.training.trainer; "
            "print(sorted(m for m in sys.modules if m.startswith('eemicrogpt_core.sweep')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"
