"""The plugin: the hook yields a BackendSpec and does no work (the registry probes and opens it lazily)."""

from __future__ import annotations

from collections.abc import Iterator

from eemicrogpt_core.backends.backend import BackendSpec, ProbeResult
from eemicrogpt_core.backends.hookspec import hookimpl


def probe() -> ProbeResult:
    return ProbeResult.ok(0, "numpy, one sequence at a time: runs anywhere, never picked by auto")


def open_session(shape, max_batch, dtype):
    from .session import ExampleSession  # imported when a session is opened, not when plugins load

    return ExampleSession(shape, max_batch, dtype)


@hookimpl
def eemicrogpt_backends() -> Iterator[BackendSpec]:
    yield BackendSpec("example_py", "a readable third-party backend in numpy", probe, open_session)
