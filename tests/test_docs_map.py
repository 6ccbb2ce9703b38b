"""docs/architecture.md against the tree: every path its code map names exists, every module of the core is
in the map under its full path, each part's folder is a map row, and the modules the faults table names exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "eemicrogpt_core"
DOC = REPO / "docs" / "architecture.md"
TICKED = re.compile(r"`([^`]+)`")
PATH = re.compile(r"^[\w.-]+(/[\w.-]+)*/?$")


def tables(text: str) -> list[list[list[str]]]:
    """Each Markdown table's body rows (header and rule dropped), as lists of cells."""
    found: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            current.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
        elif current:
            found.append(current[2:])
            current = []
    return found


def _table_with_header(text: str, first: str) -> list[list[str]]:
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(f"| {first} |")]
    assert len(starts) == 1, f"docs/architecture.md should have one table headed '{first}'"
    return next(t for t in tables("\n".join(lines[starts[0]:])))


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def code_map(doc: str) -> list[str]:
    """The paths in the first column of the code map."""
    rows = _table_with_header(doc, "part, module")
    return [t for row in rows for t in TICKED.findall(row[0])]


def core_modules() -> list[str]:
    return sorted(str(p.relative_to(REPO)) for p in CORE.rglob("*.py")
                  if p.name != "__init__.py" and "__pycache__" not in p.parts)


def test_every_path_in_the_code_map_exists(code_map: list[str]) -> None:
    assert len(code_map) > 40
    missing = [p for p in code_map if not PATH.match(p) or not (REPO / p).exists()]
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_core_module_is_in_the_code_map(code_map: list[str]) -> None:
    named = set(code_map)
    absent = [m for m in core_modules() if m not in named]
    assert not absent, f"modules missing from docs/architecture.md's code map: {absent}"
    headers = [str(p.relative_to(REPO)) for p in (CORE / "include").glob("*.h")]
    assert set(headers) <= named, "every header in eemicrogpt_core/include/ belongs in the code map"


def test_every_part_is_a_row_of_the_code_map(code_map: list[str]) -> None:
    parts = sorted(p.name for p in CORE.iterdir() if (p / "__init__.py").is_file())
    assert len(parts) >= 8
    absent = [p for p in parts if f"eemicrogpt_core/{p}/" not in code_map]
    assert not absent, f"parts without their row in docs/architecture.md: {absent}"


def test_every_core_path_anywhere_in_the_doc_exists(doc: str) -> None:
    paths = {t for t in TICKED.findall(doc) if t.startswith("eemicrogpt_core/")}
    assert paths
    assert not [p for p in paths if not (REPO / p).exists()]


def test_the_modules_the_faults_table_names_exist(doc: str) -> None:
    """Its third column names modules by file name (`rundir.py`) or by folder (`sweep/spec.py`)."""
    basenames = {p.name for p in CORE.rglob("*.py")}
    named = [t for row in _table_with_header(doc, "fault") for t in TICKED.findall(row[2]) if t.endswith(".py")]
    assert len(named) > 20
    wrong = [t for t in named if not ((CORE / t).is_file() if "/" in t else t in basenames)]
    assert not wrong, f"the faults table names modules the core does not have: {wrong}"

