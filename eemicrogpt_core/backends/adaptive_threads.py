"""threads: auto. Pick, and keep re-picking, the thread count that trains fastest on this machine right now.

A step split across two cores waits for the slower one: with another process on one core, two threads can
be several times slower than one. A backend whose results do not depend on the thread count
(BackendSpec.thread_independent) may switch at any chunk boundary without changing a bit of the run, so the
trainer measures instead of guessing: each candidate count is timed on a few short chunks, the fastest is
used, and every REPROBE_SECONDS the counts are timed again (a core that came back, or one taken away).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

REPROBE_SECONDS = 5.0  # how often the counts are measured again
PROBE_CHUNKS = 2  # chunks timed per count and round, after one warm-up chunk at a newly set count
PROBE_CHUNK_SECONDS = 0.02  # probe chunks are kept short, so a round at a slow count costs little
SWITCH_MARGIN = 0.05  # another count must be this much faster to replace the one in use


class ThreadChooser:
    """Decides the thread count chunk by chunk from measured seconds per step."""

    def __init__(self, candidates: Sequence[int], clock: Callable[[], float] = time.perf_counter) -> None:
        if not candidates or min(candidates) < 1:
            raise ValueError(f"thread candidates must be >= 1, got {list(candidates)}")
        self.candidates = sorted(set(candidates), reverse=True)
        self.clock = clock
        self.per_step: dict[int, float] = {}  # the latest round's seconds per step of each count
        self.chosen: int | None = None
        self._round: list[int] = list(self.candidates)  # counts still to time in this round
        self._samples: list[float] = []
        self._next_round = 0.0

    @property
    def probing(self) -> bool:
        """A round is under way: the trainer keeps chunks short (PROBE_CHUNK_SECONDS)."""
        return bool(self._round)

    def next_count(self) -> int:
        """The count the next chunk runs with."""
        if self._round:
            return self._round[0]
        assert self.chosen is not None
        return self.chosen

    def record(self, steps: int, seconds: float) -> str | None:
        """The chunk just run took `seconds` for `steps` steps at next_count(). Returns a one-line note when
        a round ends with a new choice, else None."""
        if steps <= 0 or seconds <= 0:
            return None
        if not self._round:
            if len(self.candidates) > 1 and self.clock() >= self._next_round:
                self._round = list(self.candidates)
            return None
        self._samples.append(seconds / steps)
        if len(self._samples) <= PROBE_CHUNKS:  # the first sample is the warm-up, then PROBE_CHUNKS timed
            return None
        self.per_step[self._round.pop(0)] = min(self._samples[1:])
        self._samples = []
        return None if self._round else self._settle()

    def settle_on(self, count: int, per_step: dict[int, float]) -> None:
        """Start from a choice already measured (the time-budget warm-up times every count): no round now,
        the next one after REPROBE_SECONDS."""
        self.per_step = dict(per_step)
        self.chosen = count
        self._round, self._samples = [], []
        self._next_round = self.clock() + REPROBE_SECONDS

    def _settle(self) -> str | None:
        best = min(self.per_step, key=lambda c: self.per_step[c])
        previous = self.chosen
        if previous is not None and best != previous and \
                self.per_step[best] > (1 - SWITCH_MARGIN) * self.per_step[previous]:
            best = previous  # not clearly faster: keep the count in use
        self.chosen = best
        self._next_round = self.clock() + REPROBE_SECONDS
        if best == previous:
            return None
        timings = ", ".join(f"{c}: {1e6 * self.per_step[c]:,.0f} us/step" for c in sorted(self.per_step))
        return f"threads: auto picked {best} ({timings})"


def auto_candidates(cores: int) -> list[int]:
    """The counts threads: auto times on `cores` physical cores: 1, 2, 4, ... and the core count itself."""
    counts, n = {max(1, cores)}, 1
    while n < cores:
        counts.add(n)
        n *= 2
    return sorted(counts)


class _Settable(Protocol):
    def set_threads(self, n: int) -> int: ...


class AdaptiveThreads:
    """threads: auto for one session: sets the chooser's count before each chunk and times the chunk."""

    def __init__(self, session: _Settable, candidates: Sequence[int],
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.session = session
        self.chooser = ThreadChooser(candidates, clock)
        self.in_use: int | None = None

    def use(self, count: int) -> int:
        """Set the session to `count` threads now (the warm-up's timing of each count); returns the count set."""
        if count != self.in_use:
            self.in_use = self.session.set_threads(count)
        return self.in_use

    def before_chunk(self, steps: int, seconds_per_step: float | None) -> int:
        """Set the next count; returns how many of `steps` to run (fewer while counts are being timed)."""
        self.use(self.chooser.next_count())
        if self.chooser.probing and seconds_per_step:
            return max(1, min(steps, int(PROBE_CHUNK_SECONDS / seconds_per_step)))
        return steps

    def after_chunk(self, steps: int, seconds: float) -> str | None:
        """Record the chunk just run; a one-line note when the choice changed."""
        return self.chooser.record(steps, seconds)
