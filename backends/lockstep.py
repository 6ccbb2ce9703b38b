"""Version and core pin of the backends in this repository, read by each backend's setup.py at build time.

The backends here release in lockstep with the core: each takes the core's version (written once, in
eemicrogpt_core/_version.py) and requires a core of the same minor series, the one it was built against
(0.2.x pins `eemicrogpt>=0.2.0,<0.3`). A backend built elsewhere pins its own range the same way by hand.
Read as text, not imported: a build environment has no eemicrogpt installed.
"""

from __future__ import annotations

import ast
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The core's file in a repository checkout; a backend that ships this module in its sdist (a copy made at
# build time) ships the version file beside it.
_SHIPPED = HERE / "_version.py"
VERSION_FILE = _SHIPPED if _SHIPPED.is_file() else HERE.parent / "eemicrogpt_core" / "_version.py"


def core_version() -> str:
    tree = ast.parse(VERSION_FILE.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return str(ast.literal_eval(node.value))
    raise RuntimeError(f"{VERSION_FILE} defines no __version__")


def core_requirement(version: str | None = None) -> str:
    """`eemicrogpt>=X.Y.Z,<X.(Y+1)`: a later patch release of the core is compatible, a minor one is not."""
    version = version or core_version()
    major, minor = (int(part) for part in version.split(".")[:2])
    return f"eemicrogpt>={version},<{major}.{minor + 1}"


def lockstep(*requires: str, siblings: tuple[str, ...] = ()) -> dict[str, object]:
    """setup() keywords: this version, the core pin, sibling backends of exactly this version, then the rest."""
    version = core_version()
    pinned = [f"{sibling}=={version}" for sibling in siblings]
    return {"version": version, "install_requires": [core_requirement(version), *pinned, *requires]}
