"""A local sweep worker: `python -m eemicrogpt_core.sweep.worker --cpus 0`, one JSON task per stdin line, one
JSON result per line back on the protocol pipe (the original stdout; anything else printed goes to stderr).

A fresh interpreter, so the BLAS thread variables the driver put in its environment are in place before numpy
loads; it pins itself to its CPUs before loading anything heavy. Ctrl-C reaches it with the driver's process
group: the trainer stops at the next chunk, saves the checkpoint and the result says "interrupted".
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eemicrogpt-sweep-worker")
    parser.add_argument("--cpus", default="", help="comma-separated CPUs to pin to (empty: no pinning)")
    parser.add_argument("--parent", type=int, default=None, help="the driver's pid: end with it")
    args = parser.parse_args(argv)
    if args.parent is not None:
        _end_with_parent(args.parent)
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1, encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not corrupt the protocol

    from ..backends.registry import load_registry  # after pinning, with the BLAS thread limits already in the env
    from .runner import run_one

    registry = load_registry()
    hello = {"ready": True, "pid": os.getpid(), "cpus": sorted(os.sched_getaffinity(0))}
    proto.write(json.dumps(hello) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            record = run_one(json.loads(line), registry)
        except KeyboardInterrupt:  # between runs, or a second Ctrl-C: the run's last checkpoint stands
            return 130
        proto.write(json.dumps(record) + "\n")
    return 0


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _end_with_parent(parent: int) -> None:
    """Ask Linux to send this worker SIGTERM when the driver dies, however it dies (SIGKILL included): the
    trainer then stops the run at its next chunk with a checkpoint, and no worker goes on as an orphan.
    Elsewhere the driver's own signal handling is what stops the workers."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the driver died before the request was in place
        os.kill(os.getpid(), signal.SIGTERM)


def _quiet_exit(code: int) -> None:
    """Exit without flushing the protocol pipe again: the driver that reads it is gone (os._exit skips the
    flush at interpreter exit that would print a BrokenPipeError for every worker)."""
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        _quiet_exit(130)
    except BrokenPipeError:
        _quiet_exit(141)  # the shell's status for SIGPIPE
