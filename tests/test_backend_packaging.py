"""Each in-repository backend's sdist builds on its own: what it shares with the repository (backends/share.py)
is copied into its `_build/` and shipped, and its setup.py reaches nothing outside its own directory."""

from __future__ import annotations

import ast
import runpy
import subprocess
import sys
import tarfile
from email.parser import Parser
from pathlib import Path
from zipfile import ZipFile

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import eemicrogpt_core

REPO = Path(__file__).resolve().parents[1]
BACKENDS = REPO / "backends"
SHARE = runpy.run_path(str(BACKENDS / "share.py"))
DIRS = sorted(p.parent.name for p in BACKENDS.glob("*/setup.py"))


def _sys_path_arguments(setup_py: Path) -> list[str]:
    """The source text of every argument a setup.py passes to sys.path.insert/append."""
    found = []
    for node in ast.walk(ast.parse(setup_py.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("insert", "append") and ast.unparse(node.func.value) == "sys.path"):
            found.append(ast.unparse(node.args[-1]))
    return found


def test_every_backend_shares_through_share_py() -> None:
    assert set(DIRS) == set(SHARE["BACKENDS"]), "a backend with a setup.py is missing from share.BACKENDS"
    for shared in SHARE["BACKENDS"].values():
        for source in (*shared.build, *shared.package):
            assert (REPO / source).is_file(), source


def _code_lines(setup_py: Path) -> list[str]:
    """A setup.py's code, docstrings and comments left out."""
    tree = ast.parse(setup_py.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    return [line.strip() for line in ast.unparse(tree).splitlines()]


@pytest.mark.parametrize("backend", DIRS)
def test_setup_py_reaches_only_its_own_directory(backend: str) -> None:
    setup_py = BACKENDS / backend / "setup.py"
    assert _sys_path_arguments(setup_py) == ["str(HERE / '_build')"], "sys.path must take only the copies"
    allowed = {"HERE = Path(__file__).resolve().parent", "SHARE = HERE.parent / 'share.py'"}  # share.py: checkouts
    outside = [line for line in _code_lines(setup_py) if ("parent" in line or ".." in line) and line not in allowed]
    assert not outside, f"{backend}/setup.py reaches outside its directory: {outside}"
    manifest = (BACKENDS / backend / "MANIFEST.in").read_text(encoding="utf-8").split("\n")
    assert "graft _build" in manifest


def _sdist(backend: str, out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(out),
                    str(BACKENDS / backend)], check=True, capture_output=True, text=True)
    (sdist,) = out.glob("*.tar.gz")
    return sdist


@pytest.mark.parametrize("backend", DIRS)
def test_sdist_ships_the_shared_files(backend: str, tmp_path: Path) -> None:
    sdist = _sdist(backend, tmp_path)
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    root = names[0].split("/")[0]
    assert all(name == root or name.startswith(root + "/") for name in names), "a member escapes the sdist root"
    members = {name.removeprefix(root + "/") for name in names}
    shared = SHARE["BACKENDS"][backend]
    expected = {f"_build/{name}" for name in shared.build.values()}
    if shared.package:
        package = next(m.split("/")[0] for m in members if m.endswith("/plugin.py") and m.count("/") == 1)
        expected |= {f"{package}/{name}" for name in shared.package.values()}
    assert expected <= members, f"missing from the sdist: {sorted(expected - members)}"
    if (BACKENDS / backend / "csrc").is_dir():  # native sources ship whatever the building machine
        assert {f"csrc/{p.name}" for p in (BACKENDS / backend / "csrc").iterdir()} <= members


def test_numpy_ref_wheel_builds_from_its_sdist_alone(tmp_path: Path) -> None:
    """Unpacked outside the repository (no ../share.py, no ../lockstep.py), the sdist builds from its copies."""
    with tarfile.open(_sdist("numpy_ref", tmp_path / "sdist")) as tar:
        tar.extractall(tmp_path / "src", filter="data")
    (src,) = (tmp_path / "src").iterdir()
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "wheel"),
                    str(src)], check=True, capture_output=True, text=True)
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    with ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(zf.read(meta).decode())
        assert not [n for n in zf.namelist() if n.startswith("_build/")], "the copies are for the build only"
    assert metadata["Version"] == eemicrogpt_core.__version__
    (core,) = [r for r in map(Requirement, metadata.get_all("Requires-Dist") or []) if r.name == "eemicrogpt"]
    assert Version(eemicrogpt_core.__version__) in core.specifier
