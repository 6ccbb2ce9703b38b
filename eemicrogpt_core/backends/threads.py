"""How many threads a step may use: the `threads` setting's default and its hand-off to a session.

The default is the number of physical cores this process may run on: the CPUs in its affinity mask, with
SMT siblings (hyper-threads of one core, which share its FMA units) counted once. Backends that cannot
split a step simply run on one thread.
"""

from __future__ import annotations

from .backend import BackendSession, ThreadedSession
from .topology import physical_core_count

# The default never exceeds this: a step holds at most 256 x 15 rows, and finer chunks than this would be
# dominated by the per-step synchronisation (a judgement, not a measurement).
MAX_DEFAULT_THREADS = 16


def apply_threads(session: BackendSession, requested: int | None) -> int:
    """Ask a backend session for `requested` threads (None: the physical cores); returns the count in use.

    Sessions without `set_threads` (the optional ThreadedSession part of the protocol) run on one thread.
    """
    if not isinstance(session, ThreadedSession):
        return 1
    default = min(physical_core_count(), MAX_DEFAULT_THREADS)
    return int(session.set_threads(requested if requested is not None else default))
