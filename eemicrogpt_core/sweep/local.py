"""The local executor: one worker process per physical core, each pinned, BLAS threads 1, fed one run at a time.

Workers are fresh interpreters (`python -m eemicrogpt_core.sweep.worker`) in their own session, so a Ctrl-C at
the terminal reaches only the driver, which then forwards exactly one SIGINT to each worker: each running run
stops at its next chunk, saves its checkpoint and reports "interrupted". A second Ctrl-C is forwarded too
and aborts at once (each run keeps its last checkpoint).

SIGTERM and SIGHUP to the driver do what Ctrl-C does (driver.run_sweep); a driver killed outright (SIGKILL) takes
its workers with it on Linux, each sent SIGTERM by the kernel (PR_SET_PDEATHSIG), which stops its run at a
checkpoint.

A worker that dies (killed, out of memory, a crash in native code) has its run recorded as failed with the
cause, and a new worker takes its place on the same CPUs, up to MAX_RESPAWNS times per place.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import IO, Any

from ..backends.topology import physical_cores
from ..base.errors import ConfigError
from .placement import THREAD_ENV_VARS, Placement, place_workers
from .runner import FAILED, INTERRUPTED

MAX_RESPAWNS = 3  # new workers per place after deaths; more deaths there mean something kills every worker
MAX_WORKERS_PER_CORE = 4  # beyond this, more workers only slow every run down and load the machine


@dataclass
class _Worker:
    proc: subprocess.Popen[str]
    cpus: list[int]
    place: int  # index into the placement
    task: dict[str, Any] | None = None
    ready: bool = False
    alive: bool = True
    stdin: IO[str] = field(init=False)

    def __post_init__(self) -> None:
        assert self.proc.stdin is not None
        self.stdin = self.proc.stdin


def worker_env(base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update({var: "1" for var in THREAD_ENV_VARS})
    return env


def worker_count(requested: int | None, runs: int | None, n_cores: int) -> tuple[int | None, str]:
    """Workers to start (None: one per physical core) and a note when the request was lowered: never more
    workers than runs, never more than MAX_WORKERS_PER_CORE per physical core (above one per core the
    placement's description warns)."""
    if requested is not None and requested < 1:
        raise ConfigError(f"--workers must be >= 1, got {requested}")
    limit = MAX_WORKERS_PER_CORE * max(n_cores, 1)
    if requested is not None and requested > limit:
        raise ConfigError(f"--workers {requested:,} is more than {MAX_WORKERS_PER_CORE} per physical core ({limit} "
                          f"here); more workers than cores only slow every run down")
    wanted = n_cores if requested is None else requested
    if runs is not None and 0 < runs < wanted:
        asked = f"--workers {requested}" if requested is not None else f"one per core ({n_cores})"
        return runs, f"{runs} worker{'s' * (runs != 1)}, not {asked}: the sweep has {runs} run{'s' * (runs != 1)}"
    return requested, ""


def exit_cause(code: int) -> str:
    """`status 3` or `killed by SIGKILL`, from a Popen return code."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"status {code}"


class LocalExecutor:
    name = "local"

    def __init__(self, workers: int | None = None, placement: Placement | None = None,
                 runs: int | None = None, threads: int = 1) -> None:
        """threads: the most threads any run asks for; each worker gets that many physical cores."""
        cores = physical_cores() if placement is None else []
        per_worker = max(1, min(threads, len(cores)))
        slots = max(1, len(cores) // per_worker)
        workers, self.note = worker_count(workers, runs, slots) if placement is None else (workers, "")
        if threads > per_worker and placement is None:
            more = f"runs ask for up to {threads} threads, more than the {len(cores)} physical cores here"
            self.note = f"{self.note}; {more}" if self.note else more
        self.placement = placement or place_workers(workers, cores, per_worker)
        self.events: queue.Queue[tuple[_Worker, dict[str, Any] | None]] = queue.Queue()
        self.workers: list[_Worker] = []  # the current worker of each place
        self.respawns = [0] * len(self.placement.cpus)
        self.interrupts = 0
        self.env = worker_env()

    @property
    def slots(self) -> int:
        return len(self.placement.cpus)

    def describe(self) -> str:
        return f"local executor: {self.placement.describe()}" + (f" ({self.note})" if self.note else "")

    def start(self) -> None:
        self.workers = [self._spawn(place, cpus) for place, cpus in enumerate(self.placement.cpus)]

    def _spawn(self, place: int, cpus: list[int]) -> _Worker:
        cmd = [sys.executable, "-m", "eemicrogpt_core.sweep.worker", "--cpus", ",".join(map(str, cpus)),
               "--parent", str(os.getpid())]
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env, text=True,
                                start_new_session=True, bufsize=1)
        worker = _Worker(proc, cpus, place)
        threading.Thread(target=self._read, args=(worker, proc.stdout), daemon=True).start()
        return worker

    def _read(self, worker: _Worker, stream: IO[str]) -> None:
        for line in stream:
            try:
                message = json.loads(line) if line.strip() else None
            except ValueError:
                continue  # not the protocol (the worker sends stray output to stderr): ignored
            if isinstance(message, dict):
                self.events.put((worker, message))
        self.events.put((worker, None))  # end of file: the worker exited

    def free(self) -> int:
        return sum(w.alive and w.task is None for w in self.workers)

    def running(self) -> int:
        return sum(w.task is not None for w in self.workers)

    def submit(self, task: dict[str, Any]) -> None:
        worker = next(w for w in self.workers if w.alive and w.task is None)
        worker.task = task
        try:
            worker.stdin.write(json.dumps(task) + "\n")
            worker.stdin.flush()
        except OSError:
            pass  # the worker has just died: its end-of-file event records the task as lost

    def wait(self, timeout: float) -> list[dict[str, Any]]:
        """Results that arrived within timeout seconds (a worker that died mid-run yields a failed record)."""
        out: list[dict[str, Any]] = []
        try:
            event = self.events.get(timeout=timeout)
        except queue.Empty:
            return out
        while True:
            worker, message = event
            if message is None:
                self._died(worker, out)
            elif message.get("ready"):
                worker.ready = True
            elif worker.task is not None:
                worker.task = None
                out.append(message)
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return out

    def _died(self, worker: _Worker, out: list[dict[str, Any]]) -> None:
        worker.alive = False
        code = worker.proc.wait()
        replace = not self.interrupts and self.respawns[worker.place] < MAX_RESPAWNS
        if worker.task is not None:
            out.append(self._lost(worker.task, code, replace))
            worker.task = None
        if replace and self.workers[worker.place] is worker:
            self.respawns[worker.place] += 1
            self.workers[worker.place] = self._spawn(worker.place, worker.cpus)

    def _lost(self, task: dict[str, Any], code: int, replaced: bool) -> dict[str, Any]:
        if self.interrupts:
            return {"run_id": task["run_id"], **task["varied"], "status": INTERRUPTED}
        then = "a new worker took its place" if replaced else "no new worker (too many died)"
        return {"run_id": task["run_id"], **task["varied"], "status": FAILED,
                "error": f"its worker process was {exit_cause(code)} during the run (see its stderr above; {then})"}

    def interrupt(self, signum: int = signal.SIGINT) -> None:
        """Forward the driver's stop signal (Ctrl-C's SIGINT, SIGTERM, SIGHUP) once to every live worker: the same
        signal, which the workers do not ignore since the driver did not (they inherit its dispositions), while a
        SIGINT could be ignored in a driver started in the background."""
        self.interrupts += 1
        for w in self.workers:
            if w.alive and w.proc.poll() is None:
                os.kill(w.proc.pid, signum)

    def close(self) -> None:
        for w in self.workers:
            if w.proc.poll() is None:
                with contextlib.suppress(OSError):
                    w.stdin.close()
        try:
            for w in self.workers:
                try:
                    w.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    w.proc.kill()
                    w.proc.wait()
        except BaseException:  # a second signal while waiting: no worker may outlive the driver
            for w in self.workers:
                if w.proc.poll() is None:
                    w.proc.kill()
                    w.proc.wait()
            raise
