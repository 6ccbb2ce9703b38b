"""`eemicrogpt --version`: the core's version and every installed backend distribution's, without importing them.

Backend distributions are found by their entry points in the `eemicrogpt.backends` group (metadata only: no
plugin code runs, so a broken plugin cannot break `--version`).
"""

from __future__ import annotations

from importlib import metadata

from .._version import __version__
from ..backends.hookspec import ENTRY_POINT_GROUP


def backend_distributions() -> list[tuple[str, str, list[str]]]:
    """(distribution, version, its entry-point names) for each installed backend distribution, sorted."""
    found: dict[str, tuple[str, list[str]]] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        name = ep.dist.name if ep.dist else "unknown"
        version = ep.dist.version if ep.dist else "?"
        found.setdefault(name, (version, []))[1].append(ep.name)
    return [(name, version, sorted(eps)) for name, (version, eps) in sorted(found.items())]


def version_report() -> str:
    lines = [f"eemicrogpt {__version__}"]
    backends = backend_distributions()
    width = max((len(name) for name, _, _ in backends), default=0)
    for name, version, eps in backends:
        lines.append(f"  {name:<{width}}  {version}  (plugins: {', '.join(eps)})")
    if not backends:
        lines.append("  no backend installed")
    return "\n".join(lines)
