"""The version is written once and every backend pins the core series it was built against."""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import eemicrogpt_core
from eemicrogpt_core.interface.versions import backend_distributions, version_report

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "backends"))
import lockstep  # noqa: E402

IN_REPO_BACKENDS = {  # distribution -> directory; these release in lockstep with the core
    "eemicrogpt-backend-numpy": "numpy_ref",
    "eemicrogpt-backend-x86": "x86",
    "eemicrogpt-backend-neon": "neon",
    "eemicrogpt-backend-sme2": "sme2_f32",
    "eemicrogpt-backend-sme2-f16": "sme2_f16",
}
EXAMPLES = ("minimal_native_backend", "minimal_python_backend")  # third-party style: own versions, pinned by hand


def _core_requirement(distribution: str) -> Requirement:
    requirements = [Requirement(r) for r in metadata.requires(distribution) or []]
    (core,) = [r for r in requirements if r.name == "eemicrogpt"]
    return core


def test_the_installed_core_is_the_version_the_source_says() -> None:
    assert metadata.version("eemicrogpt") == eemicrogpt_core.__version__ == lockstep.core_version()


def test_no_pyproject_writes_the_core_version() -> None:
    pyprojects = [REPO / "pyproject.toml", *(REPO / "backends").glob("*/pyproject.toml")]
    for path in pyprojects:
        text = path.read_text()
        assert not re.search(r"^version\s*=\s*\"", text, re.M), f"{path} hard-codes a version"
        assert re.search(r'^dynamic = \[.*"version"', text, re.M), f"{path} does not take its version dynamically"


@pytest.mark.parametrize("distribution", sorted(IN_REPO_BACKENDS))
def test_in_repo_backends_take_the_core_version_and_pin_its_series(distribution: str) -> None:
    core = Version(eemicrogpt_core.__version__)
    assert metadata.version(distribution) == str(core)
    spec = _core_requirement(distribution).specifier
    assert core in spec
    assert Version(f"{core.major}.{core.minor + 1}.0") not in spec, "a next minor core must not satisfy the pin"
    assert Version(f"{core.major}.{core.minor}.{core.micro + 1}") in spec, "a patch release must"


def test_sme2_f16_stands_on_its_own() -> None:
    """It builds from its own sdist with the shared SME2 code copied in, so it needs the core only."""
    requirements = {Requirement(r).name for r in metadata.requires("eemicrogpt-backend-sme2-f16") or []}
    assert "eemicrogpt-backend-sme2" not in requirements and "eemicrogpt" in requirements


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_backends_pin_a_range_that_admits_this_core(example: str) -> None:
    text = (REPO / "examples" / example / "pyproject.toml").read_text()
    listed = re.search(r"^dependencies = \[(.*)\]", text, re.M)
    assert listed, f"{example}/pyproject.toml lists no dependencies"
    (core,) = [r for r in map(Requirement, re.findall(r'"([^"]+)"', listed.group(1))) if r.name == "eemicrogpt"]
    assert str(core.specifier), f"{example} must pin the core series it was built against"
    assert Version(eemicrogpt_core.__version__) in core.specifier
    assert Version(f"{Version(eemicrogpt_core.__version__).major + 1}.0") not in core.specifier


@pytest.mark.parametrize(
    ("version", "requirement"),
    [("0.2.0", "eemicrogpt>=0.2.0,<0.3"), ("0.2.7", "eemicrogpt>=0.2.7,<0.3"), ("1.4.2", "eemicrogpt>=1.4.2,<1.5")],
)
def test_core_requirement(version: str, requirement: str) -> None:
    assert lockstep.core_requirement(version) == requirement


def test_version_report_lists_the_core_then_every_backend_distribution() -> None:
    lines = version_report().splitlines()
    assert lines[0] == f"eemicrogpt {eemicrogpt_core.__version__}"
    listed = {line.split()[0]: line.split()[1] for line in lines[1:]}
    for name, version, _ in backend_distributions():
        assert listed[name] == version
    for distribution in IN_REPO_BACKENDS:
        assert listed[distribution] == eemicrogpt_core.__version__
