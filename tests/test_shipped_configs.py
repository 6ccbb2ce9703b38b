"""Configs and sweep specs ship inside the package and are found by name; a path still works, and a value that
is neither is one line naming the shipped files. The core's wheel carries them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

import eemicrogpt_core
from eemicrogpt_core.base.errors import ConfigError
from eemicrogpt_core.base.shipped import SHIPPED_DIR, description, find, shipped
from eemicrogpt_core.interface import cli
from eemicrogpt_core.sweep.spec import load_spec
from eemicrogpt_core.training.config import PRESETS, TrainConfig, load_config, preset

REPO = Path(__file__).resolve().parents[1]
CONFIG_NAMES = {"d16", "d32", "d64", "d128"}
SWEEP_NAMES = {"bpc1s", "bpc1s_steps", "pareto", "time_to_2"}


def test_the_shipped_files_live_in_the_package_only() -> None:
    assert Path(eemicrogpt_core.__file__).parent / "configs" == SHIPPED_DIR
    assert set(shipped("config")) >= CONFIG_NAMES and set(shipped("sweep")) >= SWEEP_NAMES
    # One copy only: the configs live in eemicrogpt_core/configs; the checkout's configs/ is a link to it, so
    # that `--config configs/NAME.yaml` works from the repository's root as well as `--config NAME`.
    root = REPO / "configs"
    assert root.is_symlink() and root.resolve() == SHIPPED_DIR.resolve()


@pytest.mark.parametrize("kind", ["config", "sweep"])
def test_each_shipped_file_describes_itself_in_one_line(kind: str) -> None:
    for name, path in shipped(kind).items():
        first = path.read_text(encoding="utf-8").splitlines()[0]
        assert first.startswith("# ") and description(path) == first[2:], name
        assert 10 < len(description(path)) <= 100, f"{name}: the listing's line should fit a terminal"


@pytest.mark.parametrize("value", ["d16", "d16.yaml"])
def test_a_config_by_name(value: str) -> None:
    assert find(value, "config", "--config") == SHIPPED_DIR / "d16.yaml"
    assert load_config(value) == preset(16) == TrainConfig(**PRESETS[16])


def test_a_path_wins_over_a_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("d16").write_text("lr: 0.5\n", encoding="utf-8")  # a local file that happens to share the name
    assert load_config("d16").lr == 0.5
    assert load_config(tmp_path / "d16").lr == 0.5


@pytest.mark.parametrize("value", ["d24", "sub/d16", "time_to_2"])
def test_neither_a_file_nor_a_shipped_config(value: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(value)
    names = ", ".join(shipped("config"))
    assert names.startswith("d16, d32, d64, d128")  # numbers sort as numbers
    assert str(e.value) == (f"--config {value}: no such file, and not a shipped config (shipped: {names}; "
                            "`eemicrogpt configs` describes them)")


def test_a_sweep_by_name() -> None:
    spec = load_spec("time_to_2")
    assert spec.name == "time_to_2" and spec.source == str(SHIPPED_DIR / "sweeps" / "time_to_2.yaml")
    with pytest.raises(ConfigError, match=r"^sweep spec d16: no such file, and not a shipped sweep \(shipped: bpc1s, "):
        load_spec("d16")


def test_configs_command_lists_every_shipped_file() -> None:
    result = CliRunner().invoke(cli.app, ["configs"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "configs (eemicrogpt train --config NAME):"
    listed = {line.split()[0]: line.split(None, 1)[1] for line in lines if line.startswith("  ")}
    expected = {name: description(path) for kind in ("config", "sweep") for name, path in shipped(kind).items()}
    assert listed == expected
    assert "sweeps (eemicrogpt sweep NAME):" in lines


def test_sweep_command_refuses_an_unknown_name_in_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli.app, ["sweep", "time_to_3", "--out", str(tmp_path / "s")])
    assert result.exit_code == 2 and not (tmp_path / "s").exists()
    assert result.stderr.strip() == ("eemicrogpt: error: sweep spec time_to_3: no such file, and not a shipped sweep "
                                     f"(shipped: {', '.join(shipped('sweep'))}; `eemicrogpt configs` describes them)")


def test_the_wheel_carries_the_shipped_files(tmp_path: Path) -> None:
    source = tmp_path / "src"  # a copy, so the build's scratch directories stay out of the checkout
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.o")
    for part in ("eemicrogpt_core", "eemicrogpt"):
        shutil.copytree(REPO / part, source / part, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path), str(source)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = tmp_path.glob("eemicrogpt-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    for kind in ("config", "sweep"):
        for path in shipped(kind).values():
            assert path.relative_to(SHIPPED_DIR.parent.parent).as_posix() in names
    assert {"eemicrogpt/py.typed", "eemicrogpt_core/py.typed"} <= names  # PEP 561 markers
