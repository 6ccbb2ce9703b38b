"""The local executor: one worker process per physical core, each pinned, BLAS threads 1, fed one run at a time.

Workers are fresh interpreters (`python -m eemicrogpt_core.sweep.worker`) in their own session, so a Ctrl-C at
the terminal reaches only the driver, which then forwards exactly one SIGINT to each worker: each running run
stops at its next chunk, saves its checkpoint and reports "interrupted". A second Ctrl-C is forwarded too
and aborts at once (each run keeps its last checkpoint).
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

from ..errors import EemicrogptError
from ..topology import physical_cores
from .placement import THREAD_ENV_VARS, Placement, place_workers
from .runner import INTERRUPTED


@dataclass
class _Worker:
    proc: subprocess.Popen[str]
    cpus: list[int]
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


class LocalExecutor:
    name = "local"

    def __init__(self, workers: int | None = None, placement: Placement | None = None) -> None:
        if workers is not None and workers < 1:
            raise EemicrogptError(f"--workers must be >= 1, got {workers}")
        self.placement = placement or place_workers(workers, physical_cores())
        self.events: queue.Queue[tuple[int, dict[str, Any] | None]] = queue.Queue()
        self.workers: list[_Worker] = []
        self.interrupts = 0

    @property
    def slots(self) -> int:
        return len(self.placement.cpus)

    def describe(self) -> str:
        return f"local executor: {self.placement.describe()}"

    def start(self) -> None:
        env = worker_env()
        for i, cpus in enumerate(self.placement.cpus):
            cmd = [sys.executable, "-m", "eemicrogpt_core.sweep.worker", "--cpus", ",".join(map(str, cpus))]
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True,
                                    start_new_session=True, bufsize=1)
            self.workers.append(_Worker(proc, cpus))
            threading.Thread(target=self._read, args=(i, proc.stdout), daemon=True).start()

    def _read(self, index: int, stream: IO[str]) -> None:
        for line in stream:
            if line.strip():
                self.events.put((index, json.loads(line)))
        self.events.put((index, None))  # end of file: the worker exited

    def free(self) -> int:
        return sum(w.alive and w.task is None for w in self.workers)

    def running(self) -> int:
        return sum(w.task is not None for w in self.workers)

    def submit(self, task: dict[str, Any]) -> None:
        worker = next(w for w in self.workers if w.alive and w.task is None)
        worker.task = task
        worker.stdin.write(json.dumps(task) + "\n")
        worker.stdin.flush()

    def wait(self, timeout: float) -> list[dict[str, Any]]:
        """Results that arrived within timeout seconds (a worker that died mid-run yields a failed record)."""
        out: list[dict[str, Any]] = []
        try:
            event = self.events.get(timeout=timeout)
        except queue.Empty:
            return out
        while True:
            index, message = event
            worker = self.workers[index]
            if message is None:
                worker.alive = False
                code = worker.proc.wait()
                if worker.task is not None:
                    out.append(self._lost(worker.task, code))
                    worker.task = None
            elif message.get("ready"):
                worker.ready = True
            else:
                worker.task = None
                out.append(message)
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return out

    def _lost(self, task: dict[str, Any], code: int) -> dict[str, Any]:
        if self.interrupts:
            return {"run_id": task["run_id"], **task["varied"], "status": INTERRUPTED}
        return {"run_id": task["run_id"], **task["varied"], "status": "failed",
                "error": f"worker process exited with status {code} during the run (see its stderr above)"}

    def interrupt(self) -> None:
        """Forward one SIGINT to every live worker (called once per Ctrl-C the driver gets)."""
        self.interrupts += 1
        for w in self.workers:
            if w.alive and w.proc.poll() is None:
                os.kill(w.proc.pid, signal.SIGINT)

    def close(self) -> None:
        for w in self.workers:
            if w.proc.poll() is None:
                with contextlib.suppress(OSError):
                    w.stdin.close()
        for w in self.workers:
            try:
                w.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
