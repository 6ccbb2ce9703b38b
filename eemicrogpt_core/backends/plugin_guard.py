"""Calling plugin code safely: a deadline for each call, and a type check of what a plugin declares.

A plugin's probe or hook runs in a daemon worker thread. One that has not returned by the deadline is
reported as hung and left behind (a thread cannot be killed; being a daemon, it never holds up exit), so a
plugin stuck in a syscall or a loop costs at most one deadline per command, never a hang.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .backend import BackendSpec, ProbeResult

TIMEOUT_ENV = "EEMICROGPT_PLUGIN_TIMEOUT"  # seconds a probe or hook may take (default below)
DEFAULT_TIMEOUT = 20.0  # generous for emulated (QEMU) or busy machines; a hung plugin costs it once per command
SLOW_NOTICE = 3.0  # seconds after which the caller hears which calls are still running (a quiet wait looks hung)
BACKEND_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # ':' is reserved for `distribution:name`


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def plugin_timeout() -> float:
    raw = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_TIMEOUT
    except ValueError:
        return DEFAULT_TIMEOUT
    return value if math.isfinite(value) and value > 0 else DEFAULT_TIMEOUT


@dataclass
class Outcome:
    value: Any = None
    error: str | None = None  # the call raised or did not return in time
    timed_out: bool = False


class _Call(threading.Thread):
    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True, name="eemicrogpt-plugin-call")
        self.fn = fn
        self.outcome: Outcome | None = None

    def run(self) -> None:
        try:
            self.outcome = Outcome(self.fn())
        except BaseException as exc:  # SystemExit or KeyboardInterrupt from a plugin is its fault too
            self.outcome = Outcome(error=f"raised {describe(exc)}")


def call_all(fns: Sequence[Callable[[], Any]], timeout: float | None = None,
             on_slow: Callable[[list[int], float], None] | None = None) -> list[Outcome]:
    """Run each call in its own thread, all at once; wait at most `timeout` seconds in total. When calls are
    still running after SLOW_NOTICE seconds, on_slow(their indices, the limit) is called once."""
    limit = plugin_timeout() if timeout is None else timeout
    calls = [_Call(fn) for fn in fns]
    for call in calls:
        call.start()
    started = time.monotonic()
    deadline = started + limit
    notice = started + SLOW_NOTICE if on_slow is not None and limit > SLOW_NOTICE else math.inf
    for call in calls:
        while call.is_alive() and time.monotonic() < deadline:
            call.join(max(0.0, min(deadline, notice) - time.monotonic()))
            slow = [i for i, c in enumerate(calls) if c.is_alive()]
            if slow and time.monotonic() >= notice and on_slow is not None:
                notice = math.inf
                on_slow(slow, limit)
    return [
        call.outcome if call.outcome is not None
        else Outcome(error=f"did not return within {limit:g} s (hung?)", timed_out=True)
        for call in calls
    ]


def call(fn: Callable[[], Any], timeout: float | None = None) -> Outcome:
    return call_all([fn], timeout)[0]


def _positive_ints(value: object) -> bool:
    return isinstance(value, tuple) and len(value) > 0 and all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value
    )


def name_problem(name: object) -> str | None:
    """A backend name is a str of letters, digits, '_', '.', '-' (':' qualifies it), and not 'auto'."""
    if not isinstance(name, str) or not BACKEND_NAME.fullmatch(name) or name == "auto":
        return f"backend name {name!r} is not a name (letters, digits, '_', '.', '-'; not 'auto')"
    return None


def spec_problem(spec: BackendSpec) -> str | None:
    """What is wrong with the types of a plugin's BackendSpec (name aside), or None (the dataclass checks nothing)."""
    problems = []
    if not isinstance(spec.description, str):
        problems.append(f"description is {type(spec.description).__name__}, not str")
    for field in ("probe", "factory"):
        if not callable(getattr(spec, field)):
            problems.append(f"{field} is {type(getattr(spec, field)).__name__}, not callable")
    for field in ("d_models", "n_heads"):
        value = getattr(spec, field)
        if value is not None and not _positive_ints(value):
            problems.append(f"{field} must be None or a tuple of positive ints, got {value!r}")
    if not (isinstance(spec.dtypes, tuple) and spec.dtypes and all(isinstance(d, str) for d in spec.dtypes)):
        problems.append(f"dtypes must be a tuple of str, got {spec.dtypes!r}")
    if isinstance(spec.max_batch, bool) or not isinstance(spec.max_batch, int) or spec.max_batch < 1:
        problems.append(f"max_batch must be a positive int, got {spec.max_batch!r}")
    if not (isinstance(spec.precision, str) and spec.precision.strip()):
        problems.append(f"precision must be a non-empty str such as 'fp32', got {spec.precision!r}")
    if not isinstance(spec.extra, dict):
        problems.append(f"extra must be a dict, got {type(spec.extra).__name__}")
    return "; ".join(problems) or None


def probe_problem(result: object) -> str | None:
    """A probe returns a ProbeResult(available: bool, reason: str, score: int)."""
    if not isinstance(result, ProbeResult):
        return f"probe returned {type(result).__name__}, not a ProbeResult"
    for field, kind in (("available", bool), ("reason", str), ("score", int)):
        value = getattr(result, field)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"probe {field} is {type(value).__name__}, not {kind.__name__}"
    return None


def peak_value_problem(value: object) -> str | None:
    """A peak must be a finite, positive number of GFLOP/s."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"returned {type(value).__name__}, not a number"
    if not math.isfinite(value) or value <= 0:
        return f"returned {value!r}, not a finite positive GFLOP/s"
    return None
