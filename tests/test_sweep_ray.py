"""`eemicrogpt sweep --executor ray` against a real Ray cluster that the test starts itself.

The cluster and the driver run inside private network and PID namespaces (`unshare -n -p -f --mount-proc`):
the only network device is loopback, so every Ray connection stays on 127.0.0.1, and every Ray process ends
with the namespace when its first process exits (nothing is ever killed by name). Workers get the run
directories and the names file as bytes and send run directories back as bytes, so this exercises the path
a cluster without a shared filesystem takes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from reporters import StopAt
from typer.testing import CliRunner

from eemicrogpt_core import __version__
from eemicrogpt_core.backends.registry import load_registry
from eemicrogpt_core.base.errors import EemicrogptError
from eemicrogpt_core.interface.cli import app
from eemicrogpt_core.sweep import ray_executor
from eemicrogpt_core.sweep.driver import make_task, open_sweep_dir
from eemicrogpt_core.sweep.ray_executor import INSTALL_HINT, cluster_address, compatibility_problems
from eemicrogpt_core.sweep.spec import expand, load_spec
from eemicrogpt_core.training.checkpoint import load_checkpoint
from eemicrogpt_core.training.rundir import RunDir
from eemicrogpt_core.training.trainer import train

CLI_CODE = "from eemicrogpt_core.interface.cli import app; app()"
CLI = f"{shlex.quote(sys.executable)} -c '{CLI_CODE}'"
# The ray command of this interpreter's environment, whether or not that environment is on PATH.
RAY_CLI = str(Path(sys.executable).parent / "ray") if (Path(sys.executable).parent / "ray").exists() else "ray"
SPEC = {"name": "raytiny", "base": {"d_model": 16, "backend": "numpy_ref", "eval_batches": 2, "log_every": 40,
                                    "chunk_steps": 10},
        "grid": {"lr": [0.005, 0.01]}, "seeds": [1], "steps": 120}


def namespaces_unavailable() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare(1) not found (util-linux): needed to keep the Ray cluster on a private loopback"
    if shutil.which("ip") is None:
        return "ip(8) not found (iproute2): needed to bring up loopback inside the private network namespace"
    if os.geteuid() != 0:
        return "not root: unshare -n -p needs root to give the Ray cluster private network and PID namespaces"
    probe = subprocess.run(["unshare", "-n", "-p", "-f", "--mount-proc", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare -n -p -f --mount-proc fails here: {probe.stderr.strip()}"
    return None



def test_sweep_on_a_real_ray_cluster_resumes_and_brings_run_dirs_back(tmp_path: Path, names_file: Path) -> None:
    pytest.importorskip("ray", reason="Ray not installed: pip install 'eemicrogpt[ray]'")
    reason = namespaces_unavailable()
    if reason:
        pytest.skip(reason)
    spec_path = tmp_path / "raytiny.yaml"
    spec_path.write_text(yaml.safe_dump(SPEC))
    out = tmp_path / "sw"
    # One run was interrupted at step 40 earlier (here by the trainer API): the Ray worker must resume it from
    # the checkpoint the driver ships.
    spec = load_spec(spec_path)
    open_sweep_dir(out, spec)
    run = next(r for r in expand(spec) if r.run_id == "lr=0.005,seed=1")
    task = make_task(run, out)
    cfg = dataclasses.replace(run.config, data=str(names_file), out=task["run_dir"])
    partial = train(cfg, load_registry(), run_dir=RunDir.create(cfg.out, cfg), reporter=StopAt(40))
    assert partial.interrupted and load_checkpoint(Path(task["run_dir"]) / "checkpoint.npz").state.step == 40

    sweep = f"{CLI} sweep {shlex.quote(str(spec_path))} --executor ray --out {shlex.quote(str(out))} " \
            f"--data {shlex.quote(str(names_file))}"
    # Ctrl-C: long runs with rare lr values, so their worker-side temporary run directories can be told apart;
    # SIGINT goes to the driver once both runs have saved a checkpoint on the worker side.
    long_spec = tmp_path / "long.yaml"
    long_spec.write_text(yaml.safe_dump({**SPEC, "name": "raylong", "base": {**SPEC["base"], "log_every": 20},
                                         "grid": {"lr": [0.00731, 0.00732]}, "steps": 100000}))
    long_out = tmp_path / "long"
    worker_ckpts = f"{tempfile.gettempdir()}/eemicrogpt-sweep-lr=0.0073*/run/checkpoint.npz"
    long_sweep = sweep.replace(shlex.quote(str(spec_path)), shlex.quote(str(long_spec))).replace(
        shlex.quote(str(out)), shlex.quote(str(long_out)))
    script = "\n".join([
        "ip link set lo up",
        "mkdir -p /tmp/ray && mount -t tmpfs tmpfs /tmp/ray",  # Ray's files stay in this mount namespace too
        "echo devices: $(ip -o link show | cut -d: -f2 | tr -d ' ')",  # netlink sees this namespace's devices
        f"{shlex.quote(RAY_CLI)} start --head --num-cpus 2 --disable-usage-stats --include-dashboard=false"
        f" > {tmp_path}/ray.log 2>&1"
        f" || {{ cat {tmp_path}/ray.log; exit 97; }}",
        f"{sweep}; echo first=$?",
        f"{sweep}; echo second=$?",
        "set -m",  # job control: a background job keeps SIGINT (bash would ignore it for the job otherwise)
        f"{long_sweep} > {tmp_path}/long.log 2>&1 & pid=$!",
        f"for i in $(seq 1200); do [ $(ls {worker_ckpts} 2>/dev/null | wc -l) -ge 2 ] && break; sleep 0.1; done",
        "kill -INT $pid; wait $pid; echo third=$?",
    ])  # bash is PID 1 of the namespace: when it exits, the kernel ends every Ray process in it
    proc = subprocess.run(["unshare", "-n", "-p", "-f", "--mount-proc", "bash", "-c", script], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path)
    log = proc.stdout + proc.stderr
    assert "devices: lo\n" in proc.stdout, log  # loopback is the only network the cluster can use
    assert "first=0" in proc.stdout and "second=0" in proc.stdout, log
    assert "ray executor: 2 CPUs on 1 node (127.0.0.1" in proc.stdout, log
    assert f"eemicrogpt {__version__} on every node" in proc.stdout
    assert "2 runs: 0 already finished (skipped), 2 to run" in proc.stdout
    assert "2 runs: 2 already finished (skipped), 0 to run" in proc.stdout  # the second invocation

    lines = (out / "results.jsonl").read_text().splitlines()
    records = {r["run_id"]: r for r in map(json.loads, lines)}
    assert len(lines) == 2 and set(records) == {"lr=0.005,seed=1", "lr=0.01,seed=1"}
    assert records["lr=0.005,seed=1"]["resumed_from"] == 40 and records["lr=0.01,seed=1"]["resumed_from"] == 0
    for rid, r in records.items():
        assert r["status"] == "done" and r["steps"] == 120 and r["backend"] == "numpy_ref" and r["node"]
        run_dir = RunDir(out / "runs" / rid)
        assert load_checkpoint(run_dir.checkpoint_path).state.step == 120  # the worker's files came back
        assert [m["step"] for m in run_dir.read_metrics()] == [40, 80, 120]
        assert r["val_loss"] == run_dir.read_metrics()[-1]["val_loss"]
        saved = yaml.safe_load(run_dir.config_path.read_text())
        assert saved["out"] == str(run_dir.path) and saved["data"] == str(names_file)  # driver paths, not the worker's

    assert "third=130" in proc.stdout, log + (tmp_path / "long.log").read_text()
    stopped = {r["run_id"]: r for r in map(json.loads, (long_out / "results.jsonl").read_text().splitlines())}
    assert set(stopped) == {"lr=0.00731,seed=1", "lr=0.00732,seed=1"}
    for rid, r in stopped.items():
        assert r["status"] == "interrupted"
        ckpt = load_checkpoint(long_out / "runs" / rid / "checkpoint.npz")  # came back from the worker
        assert 0 < ckpt.state.step == r["steps"] < 100000


def test_without_ray_the_executor_says_how_to_install_it(tmp_path: Path, names_file: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    code = "import sys; sys.modules['ray'] = None; from eemicrogpt_core.interface.cli import app; app()"
    proc = subprocess.run([sys.executable, "-c", code, "sweep", str(spec), "--executor", "ray", "--data",
                           str(names_file), "--out", str(tmp_path / "sw")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"eemicrogpt: error: {INSTALL_HINT}"
    assert "pip install 'eemicrogpt[ray]'" in INSTALL_HINT
    assert not (tmp_path / "sw").exists()


def _report(version: str = __version__, **backends: tuple[str, bool]) -> dict:
    return {"eemicrogpt": version, "backends": {n: {"version": v, "available": a} for n, (v, a) in backends.items()}}


def test_version_check_names_each_node_and_what_it_lacks() -> None:
    needed = {"avx512": "0.3.0", "auto": None}
    reports = {
        "10.0.0.1 (aaa)": _report(avx512=("0.3.0", True)),
        "10.0.0.2 (bbb)": _report("0.0.9", avx512=("0.3.0", True)),
        "10.0.0.3 (ccc)": _report(numpy_ref=("0.1.0", True)),
        "10.0.0.4 (ddd)": _report(avx512=("0.2.0", True)),
        "10.0.0.5 (eee)": _report(avx512=("0.3.0", False)),
        "10.0.0.6 (fff)": {"error": "ModuleNotFoundError: No module named 'eemicrogpt_core'"},
    }
    problems = compatibility_problems(reports, needed)
    assert problems == [
        f"node 10.0.0.2 (bbb) lacks eemicrogpt {__version__} (has 0.0.9)",
        "node 10.0.0.3 (ccc) lacks backend avx512 0.3.0 (not installed)",
        "node 10.0.0.4 (ddd) lacks backend avx512 0.3.0 (has 0.2.0)",
        "node 10.0.0.5 (eee) lacks backend avx512 usable on its CPU (installed but unavailable), "
        "any available backend (for backend 'auto')",
        "node 10.0.0.6 (fff): cannot load eemicrogpt (ModuleNotFoundError: No module named 'eemicrogpt_core')",
    ]


def test_address_without_ray_executor_is_refused(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    result = CliRunner().invoke(app, ["sweep", str(spec), "--workers", "2", "--executor", "ray"])
    assert result.exit_code == 2 and "--workers is for the local executor" in result.output


def test_no_cluster_is_a_one_line_error_within_seconds(tmp_path: Path, names_file: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray", reason="Ray not installed: pip install 'eemicrogpt[ray]'")
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    # Port 1 on loopback: nothing listens, the connection is refused at once (no traffic leaves the machine).
    cmd = [sys.executable, "-c", CLI_CODE, "sweep", str(spec), "--executor",
           "ray", "--address", "127.0.0.1:1", "--data", str(names_file), "--out", str(tmp_path / "sw")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "no Ray cluster answers at 127.0.0.1:1" in proc.stderr
    assert not (tmp_path / "sw").exists()


def test_cluster_address_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recorded = tmp_path / "ray_current_cluster"
    monkeypatch.setattr(ray_executor, "RAY_CURRENT_CLUSTER", recorded)
    with pytest.raises(EemicrogptError, match="no Ray cluster to connect to"):
        cluster_address(None, {})
    recorded.write_text("127.0.0.1:6379\n")
    assert cluster_address(None, {}) == "127.0.0.1:6379"
    assert cluster_address("auto", {"RAY_ADDRESS": "10.1.2.3:6379"}) == "10.1.2.3:6379"
    assert cluster_address("127.0.0.1:7000", {"RAY_ADDRESS": "10.1.2.3:6379"}) == "127.0.0.1:7000"


# ---- what a node returns ----------------------------------------------------------------------------------
def _task(tmp_path: Path) -> dict:
    spec = load_spec(_write_spec(tmp_path))
    return make_task(expand(spec)[0], tmp_path / "sw")


def _write_spec(tmp_path: Path) -> Path:
    path = tmp_path / "raytiny.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    return path


@pytest.mark.parametrize(("files", "problem"), [
    ({"../../escaped.txt": b"owned"}, "an unexpected file '../../escaped.txt'"),
    ({"/etc/cron.d/x": b"owned"}, "an unexpected file '/etc/cron.d/x'"),
    ({"metrics.jsonl": "text, not bytes"}, "metrics.jsonl as str, not bytes"),
    ("oversized", "checkpoint.npz of {limit_plus_one:,} bytes, more than a run of this size writes ({limit:,})"),
    (["config.yaml"], "files of type list"),
])
def test_a_node_returning_unexpected_files_writes_nothing(files, problem: str, tmp_path: Path) -> None:
    task = _task(tmp_path)
    if files == "oversized":  # one byte more than three float64 copies of the largest model this config makes
        limit = ray_executor.run_file_limits(task["config"])["checkpoint.npz"]
        files, problem = {"checkpoint.npz": b"\0" * (limit + 1)}, problem.format(limit=limit, limit_plus_one=limit + 1)
    with pytest.raises(EemicrogptError, match=f"the Ray task returned {re.escape(problem)}.*; nothing of it "
                                              "was written"):
        ray_executor.RayExecutor._store(Path(task["run_dir"]), files, task["config"], {"status": "done"})
    assert not any(tmp_path.rglob("escaped.txt")) and not Path(task["run_dir"]).exists()


def test_the_expected_files_are_stored_with_the_drivers_paths(tmp_path: Path) -> None:
    task = _task(tmp_path)
    run_dir = Path(task["run_dir"])
    ray_executor.RayExecutor._store(run_dir, {"config.yaml": b"d_model: 16\ndata: /worker/names.txt\n",
                                              "metrics.jsonl": b'{"step": 40}\n'}, task["config"], {})
    assert sorted(p.name for p in run_dir.iterdir()) == [".eemicrogpt-run", "config.yaml", "metrics.jsonl"]
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["data"] == task["config"]["data"]


HOSTILE_DRIVER = '''
import json, sys
from pathlib import Path
import ray
from rich.console import Console
from eemicrogpt_core.sweep.driver import make_task
from eemicrogpt_core.sweep.ray_executor import RayExecutor
from eemicrogpt_core.sweep.spec import expand, load_spec

def hostile(task, names, files):  # what a compromised node could send back
    return {"run_id": "another-run", "status": "done"}, {"../../escaped.txt": b"owned", "config.yaml": b"x: 1\\n"}

ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
executor = RayExecutor(ray, b"anna\\n", Console(stderr=True))
executor.remote = ray.remote(num_cpus=1, max_retries=0)(hostile)
task = make_task(expand(load_spec(sys.argv[1]))[0], Path(sys.argv[2]))
executor.submit(task)
records = []
while not records:
    records = executor.wait(1.0)
print("RECORD " + json.dumps(records[0]))
ray.shutdown()
'''


def test_a_hostile_task_on_a_real_cluster_cannot_write_outside_its_run(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="Ray not installed: pip install 'eemicrogpt[ray]'")
    reason = namespaces_unavailable()
    if reason:
        pytest.skip(reason)
    script = tmp_path / "driver.py"
    script.write_text(HOSTILE_DRIVER)
    sweep_dir = tmp_path / "sw"
    commands = "\n".join([
        "ip link set lo up",
        "mkdir -p /tmp/ray && mount -t tmpfs tmpfs /tmp/ray",
        # HOME of its own: a local ray.init() leaves ~/.ray/auth_token, which later clusters would then require.
        f"HOME={shlex.quote(str(tmp_path / 'home'))} {shlex.quote(sys.executable)} {shlex.quote(str(script))} "
        f"{shlex.quote(str(_write_spec(tmp_path)))} {shlex.quote(str(sweep_dir))}",
    ])  # bash is PID 1 of the namespace: every Ray process ends with it
    proc = subprocess.run(["unshare", "-n", "-p", "-f", "--mount-proc", "bash", "-c", commands], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RECORD ")), None)
    assert line is not None, proc.stdout + proc.stderr
    record = json.loads(line[len("RECORD "):])
    assert record["status"] == "failed" and record["run_id"] == "lr=0.005,seed=1"
    assert "the Ray task returned an unexpected file '../../escaped.txt'" in record["error"]
    assert not any(tmp_path.rglob("escaped.txt")) and not (sweep_dir / "runs").exists()
