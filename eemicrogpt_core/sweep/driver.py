"""Runs a sweep: checks everything up front, lays out the sweep directory, feeds an executor, records results.

Sweep directory:
    spec.yaml        the resolved spec (a re-run with a different spec into the same directory is refused)
    results.jsonl    one record per finished, failed or interrupted run (the last record of a run wins)
    results.csv      the latest record of every run, sorted by val loss
    runs/<run id>/   ordinary run directories (config.yaml, metrics.jsonl, checkpoint.npz)
Re-running skips finished runs, resumes interrupted ones from their checkpoints and retries failed ones.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from ..atomic import atomic_write_text
from ..config import resolve_backend
from ..data import read_names
from ..datafile import resolve_data_path
from ..errors import ConfigError
from ..model import NAMES_VOCAB
from ..registry import BackendRegistry
from .progress import SweepProgress
from .results import ResultStore
from .runner import FAILED, INTERRUPTED
from .spec import Run, SweepSpec, expand

SPEC_NAME = "spec.yaml"
RUNS_DIR = "runs"


class Executor(Protocol):
    name: str

    @property
    def slots(self) -> int: ...
    def describe(self) -> str: ...
    def start(self) -> None: ...
    def free(self) -> int: ...
    def running(self) -> int: ...
    def submit(self, task: dict[str, Any]) -> None: ...
    def wait(self, timeout: float) -> list[dict[str, Any]]: ...
    def interrupt(self) -> None: ...
    def close(self) -> None: ...


@dataclass
class SweepOutcome:
    sweep_dir: Path
    rows: list[dict[str, Any]]  # this spec's runs, latest record each, sorted by val loss
    skipped: int
    interrupted: bool

    @property
    def failed(self) -> int:
        return sum(r.get("status") == FAILED for r in self.rows)


def prepare_runs(spec: SweepSpec, backend: str | None, data: str | None) -> list[Run]:
    """Expand the spec and resolve backend and names file for every run (the file is read once here, so a
    missing or malformed one fails before anything starts)."""
    runs = expand(spec)
    data_paths = {}
    resolved = []
    for run in runs:
        cfg = run.config
        if cfg.data not in data_paths:
            path = resolve_data_path(data, cfg.data)
            read_names(path, drop_invalid=cfg.drop_invalid)
            data_paths[cfg.data] = str(path)
        cfg = dataclasses.replace(cfg, backend=resolve_backend(backend, cfg.backend), data=data_paths[cfg.data])
        resolved.append(dataclasses.replace(run, config=cfg))
    return resolved


def check_backends(runs: list[Run], registry: BackendRegistry) -> None:
    """Every run's backend can run its shape here (raises the registry's one-line error otherwise)."""
    seen = set()
    for cfg in (r.config for r in runs):
        key = (cfg.backend, cfg.d_model, cfg.n_heads, cfg.batch, cfg.dtype, cfg.precision)
        if key not in seen:
            seen.add(key)
            registry.select(cfg.backend, cfg.model_shape(NAMES_VOCAB), cfg.batch, cfg.dtype, cfg.precision)


def open_sweep_dir(sweep_dir: Path, spec: SweepSpec) -> None:
    """Create the directory with spec.yaml, or check that an existing one was made by the same spec."""
    text = yaml.safe_dump(spec.resolved(), sort_keys=False)
    path = sweep_dir / SPEC_NAME
    if path.is_file():
        if yaml.safe_load(path.read_text(encoding="utf-8")) != yaml.safe_load(text):
            raise ConfigError(f"{sweep_dir} holds a sweep made from a different spec ({path}); pick another --out "
                              "or remove that directory")
        return
    if sweep_dir.exists() and any(sweep_dir.iterdir()):
        raise ConfigError(f"--out {sweep_dir} exists and is not a sweep directory (no {SPEC_NAME})")
    atomic_write_text(path, text)


def make_task(run: Run, sweep_dir: Path) -> dict[str, Any]:
    run_dir = sweep_dir / RUNS_DIR / run.run_id
    config = dataclasses.replace(run.config, out=str(run_dir)).to_dict()
    return {"run_id": run.run_id, "varied": run.varied, "config": config, "run_dir": str(run_dir)}


def run_sweep(spec: SweepSpec, runs: list[Run], sweep_dir: Path, executor: Executor,
              progress: SweepProgress) -> SweepOutcome:
    """Run every unfinished run; Ctrl-C stops them at a chunk boundary with a checkpoint each."""
    open_sweep_dir(sweep_dir, spec)
    store = ResultStore(sweep_dir, spec.varied_keys)
    todo = [r for r in runs if not store.finished(r.run_id)]
    skipped = len(runs) - len(todo)
    pending = deque(make_task(r, sweep_dir) for r in todo)
    progress.begin(len(runs), skipped, executor.describe(), [store.latest[r.run_id] for r in runs
                                                             if store.finished(r.run_id)])
    interrupted = False
    executor.start()
    try:
        while pending or executor.running():
            try:
                while pending and executor.free():
                    task = pending.popleft()
                    executor.submit(task)
                    progress.started(task["run_id"])
                for record in executor.wait(0.2):
                    store.add(record)
                    progress.finished(record)
                if pending and not executor.free() and not executor.running():
                    raise ConfigError(f"every {executor.name} worker exited; {len(pending)} runs not started")
                progress.tick(executor.running(), len(pending), executor.slots)
            except KeyboardInterrupt:
                if not interrupted:
                    progress.note("Ctrl-C: running runs stop at their next chunk and save a checkpoint "
                                  "(press again to abort at once; each run keeps its last checkpoint)")
                interrupted = True
                pending.clear()
                executor.interrupt()
    finally:
        executor.close()
        progress.end()
    rows = store.rows([r.run_id for r in runs])
    interrupted = interrupted or any(r.get("status") == INTERRUPTED for r in rows)
    return SweepOutcome(sweep_dir, rows, skipped, interrupted)

