"""The core's parts and who may import whom: each subpackage's docstring says it ("May import: ..."), and
this test holds every module to its part's line, so a lower part importing a higher one fails here."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import eemicrogpt_core

CORE = Path(eemicrogpt_core.__file__).parent
PARTS = sorted(p.name for p in CORE.iterdir() if (p / "__init__.py").is_file())
ROOT_MODULES = {"_version"}  # the core's own top level: the version, importable by every part


def allowed_imports(part: str) -> set[str] | None:
    """The parts `part` may import, from its docstring; None for 'every other part of the core'."""
    doc = importlib.import_module(f"eemicrogpt_core.{part}").__doc__ or ""
    match = re.search(r"May import: (.+?)\.\s*$", doc, re.M)
    assert match, f"eemicrogpt_core/{part}/__init__.py's docstring lacks its 'May import:' line"
    text = match.group(1)
    if text.startswith("every other part"):
        return None
    if text == "nothing else of the core":
        return set()
    return {name.strip() for name in text.split(",")}


def core_imports(path: Path, core: Path = CORE) -> set[str]:
    """The core parts (first component under eemicrogpt_core) a module imports, lazily or not."""
    tree = ast.parse(path.read_text())
    package = path.relative_to(core.parent).with_suffix("").parts[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                module = [*base, *(node.module.split(".") if node.module else [])]
            else:
                module = (node.module or "").split(".")
            names = [alias.name for alias in node.names]
            targets = [[*module, name] for name in names] if len(module) == 1 else [module]
        elif isinstance(node, ast.Import):
            targets = [alias.name.split(".") for alias in node.names]
        else:
            continue
        for target in targets:
            if target[0] == "eemicrogpt_core" and len(target) > 1 and target[1] not in ROOT_MODULES | {"__version__"}:
                found.add(target[1])
            elif target[0] == "eemicrogpt":
                found.add("<eemicrogpt>")
    return found


def test_every_part_declares_what_it_may_import() -> None:
    assert set(PARTS) >= {"base", "model", "data", "backends", "training", "interface"}
    for part in PARTS:
        allowed = allowed_imports(part)
        if allowed is not None:
            assert allowed <= set(PARTS), f"{part} names parts that do not exist: {allowed - set(PARTS)}"


@pytest.mark.parametrize("part", PARTS)
def test_a_part_imports_only_what_its_docstring_allows(part: str) -> None:
    allowed = allowed_imports(part)
    for path in sorted((CORE / part).rglob("*.py")):
        used = core_imports(path) - {part}
        assert "<eemicrogpt>" not in used, f"{path.relative_to(CORE)} imports the eemicrogpt API package"
        if allowed is not None:
            extra = used - allowed
            assert not extra, f"{path.relative_to(CORE)} imports {sorted(extra)}, which {part} may not"


def test_the_core_has_no_loose_modules() -> None:
    loose = {p.stem for p in CORE.glob("*.py")} - {"__init__", *ROOT_MODULES}
    assert not loose, f"modules outside any part: {sorted(loose)}"


def test_the_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    """The checker itself: relative and absolute imports of other parts are both seen."""
    module = tmp_path / "eemicrogpt_core" / "model" / "x.py"
    module.parent.mkdir(parents=True)
    module.write_text("from ..training.config import TrainConfig\nfrom eemicrogpt_core.tools import bench\n"
                      "from . import vocab\nfrom .. import __version__\n")
    assert core_imports(module, tmp_path / "eemicrogpt_core") == {"training", "tools", "model"}
