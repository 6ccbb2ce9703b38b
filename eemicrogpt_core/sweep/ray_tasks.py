"""What a Ray worker runs (plain functions; ray_executor wraps them as tasks). Nothing here assumes the worker
sees the driver's filesystem: the names file and a resumed run's files arrive as bytes, and the run directory
goes back as bytes."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path
from typing import Any

from ..backends.registry import BackendRegistry, load_registry
from ..training.rundir import CHECKPOINT_NAME, CONFIG_NAME, METRICS_NAME
from .runner import run_one

RUN_FILES = (CONFIG_NAME, METRICS_NAME, CHECKPOINT_NAME)
_registry: BackendRegistry | None = None  # one per worker process: plugin discovery and probes run once


def _get_registry() -> BackendRegistry:
    global _registry
    if _registry is None:
        _registry = load_registry()
    return _registry


def read_run_files(run_dir: Path) -> dict[str, bytes]:
    return {name: (run_dir / name).read_bytes() for name in RUN_FILES if (run_dir / name).is_file()}


def run_task(task: dict[str, Any], names: bytes, files: dict[str, bytes]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Train one run in a private temporary directory; returns its record and its run directory's files."""
    with tempfile.TemporaryDirectory(prefix=f"eemicrogpt-sweep-{task['run_id'][:80]}-") as tmp:
        names_path = Path(tmp) / "names.txt"
        names_path.write_bytes(names)
        run_dir = Path(tmp) / "run"
        if files:
            run_dir.mkdir()
            for name, data in files.items():
                (run_dir / name).write_bytes(data)
        local = dict(task, run_dir=str(run_dir), config=dict(task["config"], data=str(names_path), out=str(run_dir)))
        record = run_one(local, _get_registry())
        record["node"] = socket.gethostname()
        return record, read_run_files(run_dir) if run_dir.is_dir() else {}


def node_report() -> dict[str, Any]:
    """What this node has: its eemicrogpt and backend versions (for the start-up compatibility check)."""
    from .. import __version__

    registry = _get_registry()
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "eemicrogpt": __version__,
        "backends": {e.name: {"version": e.version, "available": e.available} for e in registry.entries},
    }
