"""The Ray executor: each run is a Ray task with one CPU on an existing cluster; results and run directories come
back to the driver's sweep directory as bytes, so workers need not share its filesystem.

At start every node with CPUs reports its eemicrogpt and backend versions; a node that lacks what the sweep
needs is named, with what it lacks, before any run starts. Ctrl-C cancels the running tasks: Ray raises
KeyboardInterrupt in each, the trainer stops at its next chunk and saves, and the task returns its files as
usual (checked by hand: the next invocation resumed both runs). A task that dies instead leaves the driver's
last copy of its run directory, from which the next invocation resumes (or starts afresh if there is none).

What a task returns is trusted no more than a plugin: only the run files the driver expects (by exact name,
as bytes, each within a size bound) are written, into that run's directory, and the record must be a mapping;
anything else fails the run with one line and writes nothing.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from .. import __version__
from ..backends.registry import load_registry
from ..base.abi import MAX_VOCAB
from ..base.atomic import atomic_write_bytes
from ..base.errors import ConfigError, EemicrogptError, StorageError, describe_os_error
from ..training.config import build_config
from ..training.rundir import CHECKPOINT_NAME, CONFIG_NAME, METRICS_NAME, RunDir
from .placement import THREAD_ENV_VARS
from .ray_tasks import RUN_FILES, node_report, read_run_files, run_task
from .runner import FAILED, INTERRUPTED, one_line
from .spec import Run

INSTALL_HINT = "--executor ray needs Ray, an optional extra: pip install 'eemicrogpt[ray]' (or pip install ray)"
# `ray start --head` records its address here; Ray's address "auto" reads it.
RAY_CURRENT_CLUSTER = Path(os.environ.get("RAY_TMPDIR", "/tmp")) / "ray" / "ray_current_cluster"
PROBE_SECONDS = 5.0
CONFIG_BYTES = 1 << 20  # a dumped config is a few hundred bytes
METRICS_BYTES = 256 << 20  # a record per log step is ~150 bytes: a million log steps
CHECKPOINT_SLACK = 2 << 20  # beyond three float64 arrays of n_params: the metadata JSON and the zip's headers


def run_file_limits(config: dict[str, Any]) -> dict[str, int]:
    """The size bound of each file a task may return for a run of this config."""
    try:
        n_params = build_config([("sweep task", config)]).model_shape(MAX_VOCAB).n_params  # the largest vocabulary
    except ConfigError:
        n_params = 0  # the run could not have trained: no checkpoint is acceptable
    return {CONFIG_NAME: CONFIG_BYTES, METRICS_NAME: METRICS_BYTES,
            CHECKPOINT_NAME: 3 * 8 * n_params + CHECKPOINT_SLACK if n_params else 0}


def returned_problem(record: object, files: object, config: dict[str, Any]) -> str | None:
    """What is wrong with a task's (record, files), or None: files must map expected names to bytes in bounds."""
    if not isinstance(record, dict):
        return f"a record of type {type(record).__name__}, not a mapping"
    if not isinstance(files, dict):
        return f"files of type {type(files).__name__}, not a mapping of names to bytes"
    limits = run_file_limits(config)
    for name, data in files.items():
        if name not in RUN_FILES:
            return f"an unexpected file {str(name)[:100]!r} (a run returns only {', '.join(RUN_FILES)})"
        if not isinstance(data, bytes):
            return f"{name} as {type(data).__name__}, not bytes"
        if len(data) > limits[name]:
            return f"{name} of {len(data):,} bytes, more than a run of this size writes ({limits[name]:,})"
    return None


def cluster_address(address: str | None, env: dict[str, str] | None = None) -> str:
    """--address > $RAY_ADDRESS > the cluster `ray start` last started here (what Ray's "auto" finds)."""
    env = dict(os.environ) if env is None else env
    for chosen in (address, env.get("RAY_ADDRESS")):
        if chosen and chosen != "auto":
            return chosen
    try:
        found = RAY_CURRENT_CLUSTER.read_text().strip()
    except OSError:
        found = ""
    if not found:
        raise EemicrogptError("no Ray cluster to connect to: pass --address HOST:PORT, set $RAY_ADDRESS, or start "
                              "one here with `ray start --head`")
    return found


def probe(address: str) -> None:
    """Fail in seconds, in one line, when nothing listens at HOST:PORT (Ray itself retries for minutes)."""
    if "://" in address:
        return  # ray:// (Ray Client) and other schemes: left to Ray
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=PROBE_SECONDS):
            pass
    except ValueError:
        raise EemicrogptError(f"Ray address {address!r} is not HOST:PORT") from None
    except OSError as e:
        raise EemicrogptError(f"no Ray cluster answers at {address} ({e.strerror or e}); start one with "
                              "`ray start --head` or pass --address") from None


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise EemicrogptError(INSTALL_HINT) from None
    return ray


def needed_backends(runs: list[Run]) -> dict[str, str | None]:
    """Backend name -> the driver's installed version of it (None: not installed on the driver); 'auto' needs
    only some available backend on each node."""
    registry = load_registry()
    names = {r.config.backend for r in runs}
    entries = {n: registry.get(n) for n in sorted(names)}
    return {n: (entry.version if entry is not None else None) for n, entry in entries.items()}


def compatibility_problems(reports: dict[str, dict[str, Any]], needed: dict[str, str | None]) -> list[str]:
    """One phrase per node that cannot run the sweep like the driver: wrong eemicrogpt, a missing backend, a
    backend at another version or unavailable on that CPU. reports maps a node's name to node_report()."""
    problems = []
    for node, report in sorted(reports.items()):
        if "error" in report:
            problems.append(f"node {node}: cannot load eemicrogpt ({report['error']})")
            continue
        lacks = []
        if report["eemicrogpt"] != __version__:
            lacks.append(f"eemicrogpt {__version__} (has {report['eemicrogpt']})")
        backends = report["backends"]
        for name, version in needed.items():
            if name == "auto":
                if not any(b["available"] for b in backends.values()):
                    lacks.append("any available backend (for backend 'auto')")
                continue
            have = backends.get(name)
            if have is None:
                lacks.append(f"backend {name} {version or ''}".rstrip() + " (not installed)")
            elif version is not None and have["version"] != version:
                lacks.append(f"backend {name} {version} (has {have['version']})")
            elif not have["available"]:
                lacks.append(f"backend {name} usable on its CPU (installed but unavailable)")
        if lacks:
            problems.append(f"node {node} lacks {', '.join(lacks)}")
    return problems


class RayExecutor:
    name = "ray"

    def __init__(self, ray: Any, names: bytes, console: Console) -> None:
        self.ray = ray
        self.console = console
        self.names_ref = ray.put(names)
        self.remote = ray.remote(num_cpus=1, max_retries=0)(run_task).options(
            runtime_env={"env_vars": {var: "1" for var in THREAD_ENV_VARS}}
        )
        self.inflight: dict[Any, dict[str, Any]] = {}
        self.cpus = int(ray.cluster_resources().get("CPU", 0))
        self.nodes: list[str] = []

    @classmethod
    def connect(cls, address: str | None, runs: list[Run], console: Console) -> RayExecutor:
        ray = import_ray()
        address = cluster_address(address)
        probe(address)
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise EemicrogptError(f"cannot connect to the Ray cluster at {address}: {one_line(e)}") from None
        data_files = {r.config.data for r in runs}
        if len(data_files) != 1:
            raise EemicrogptError("--executor ray ships one names file to the workers; the runs use "
                                  f"{len(data_files)}: {', '.join(sorted(map(str, data_files)))}")
        data_file = data_files.pop()
        if data_file is None:  # prepare_runs resolves every run's names file before any executor starts
            raise EemicrogptError("the runs' names file is not resolved")
        executor = cls(ray, Path(data_file).read_bytes(), console)
        if executor.cpus < 1:
            raise EemicrogptError("the Ray cluster has no CPUs to run on")
        executor.check_nodes(needed_backends(runs))
        return executor

    def check_nodes(self, needed: dict[str, str | None]) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        report_task = self.ray.remote(num_cpus=0, max_retries=0)(node_report)
        refs = {}
        for node in self.ray.nodes():
            if not node.get("Alive") or node.get("Resources", {}).get("CPU", 0) < 1:
                continue  # runs never land on a node without CPUs
            name = f"{node.get('NodeManagerAddress', '?')} ({node['NodeID'][:12]})"
            strategy = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            refs[name] = report_task.options(scheduling_strategy=strategy).remote()
        reports: dict[str, dict[str, Any]] = {}
        for name, ref in refs.items():
            try:
                reports[name] = self.ray.get(ref, timeout=120)
            except Exception as e:  # the node cannot even import eemicrogpt, or died
                reports[name] = {"error": one_line(e).splitlines()[0][:300]}
        problems = compatibility_problems(reports, needed)
        if problems:
            raise EemicrogptError("Ray nodes incompatible with this driver: " + "; ".join(problems))
        self.nodes = sorted(reports)

    @property
    def slots(self) -> int:
        return self.cpus

    def describe(self) -> str:
        nodes = len(self.nodes)
        return (f"ray executor: {self.cpus} CPUs on {nodes} node{'s' * (nodes != 1)} ({', '.join(self.nodes)}), "
                f"eemicrogpt {__version__} on every node, one CPU per run, BLAS threads 1")

    def start(self) -> None:
        pass

    def free(self) -> int:
        return max(self.cpus - len(self.inflight), 0)

    def running(self) -> int:
        return len(self.inflight)

    def submit(self, task: dict[str, Any]) -> None:
        files = read_run_files(Path(task["run_dir"])) if (Path(task["run_dir"]) / CHECKPOINT_NAME).is_file() else {}
        self.inflight[self.remote.remote(task, self.names_ref, files)] = task

    def wait(self, timeout: float) -> list[dict[str, Any]]:
        if not self.inflight:
            return []
        ready, _ = self.ray.wait(list(self.inflight), num_returns=len(self.inflight), timeout=timeout)
        return [self._collect(ref, self.inflight.pop(ref)) for ref in ready]

    def _collect(self, ref: Any, task: dict[str, Any]) -> dict[str, Any]:
        base = {"run_id": task["run_id"], **task["varied"]}
        try:
            record, files = self.ray.get(ref)
        except self.ray.exceptions.TaskCancelledError:
            return {**base, "status": INTERRUPTED}
        except Exception as e:
            return {**base, "status": FAILED, "error": f"Ray task failed: {one_line(e).splitlines()[0][:300]}"}
        try:
            self._store(Path(task["run_dir"]), files, task["config"], record)
        except EemicrogptError as e:
            return {**base, "status": FAILED, "error": one_line(e)}
        return {**record, "run_id": task["run_id"]}  # a task cannot speak for another run

    @staticmethod
    def _store(run_dir: Path, files: dict[str, bytes], config: dict[str, Any], record: object = None) -> None:
        """The worker's run directory, with config.yaml naming the driver's paths rather than the worker's;
        nothing is written unless every file is one the driver expects (returned_problem)."""
        problem = returned_problem({} if record is None else record, files, config)
        if problem is not None:
            raise EemicrogptError(f"the Ray task returned {problem}; nothing of it was written")
        files = dict(files)
        if CONFIG_NAME in files:
            try:
                saved = yaml.safe_load(files[CONFIG_NAME]) or {}
            except yaml.YAMLError as e:
                raise EemicrogptError(f"the Ray task returned an unreadable {CONFIG_NAME} ({one_line(e)[:200]}); "
                                      "nothing of it was written") from None
            if not isinstance(saved, dict):
                raise EemicrogptError(f"the Ray task returned a {CONFIG_NAME} that is not a mapping; nothing of it "
                                      "was written")
            saved.update(data=config["data"], out=str(run_dir))
            files[CONFIG_NAME] = yaml.safe_dump(saved, sort_keys=False).encode()
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            RunDir(run_dir).mark()
            for name, data in files.items():
                atomic_write_bytes(run_dir / name, data)
        except OSError as e:
            raise StorageError(describe_os_error(e, "cannot store the run's files")) from None

    def interrupt(self, signum: int = signal.SIGINT) -> None:  # Ray cancels the tasks whatever the signal
        for ref in self.inflight:
            self.ray.cancel(ref)

    def close(self) -> None:
        self.ray.shutdown()  # disconnects the driver; the cluster keeps running
