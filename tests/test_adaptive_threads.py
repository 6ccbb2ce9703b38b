"""threads: auto's chooser, driven by a fake clock and chosen step times (no real threads, no timing)."""

from __future__ import annotations

import pytest

from eemicrogpt_core.backends.adaptive_threads import (
    PROBE_CHUNK_SECONDS,
    PROBE_CHUNKS,
    REPROBE_SECONDS,
    AdaptiveThreads,
    ThreadChooser,
    auto_candidates,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_round(chooser: ThreadChooser, us_per_step: dict[int, float]) -> list[str]:
    """Feed chunks of 10 steps until the round ends; each count's chunks take its us/step."""
    notes = []
    while chooser.probing:
        count = chooser.next_count()
        note = chooser.record(10, 10 * us_per_step[count] * 1e-6)
        if note:
            notes.append(note)
    return notes


def test_picks_the_faster_count_and_says_so() -> None:
    chooser = ThreadChooser([1, 2], clock=Clock())
    notes = run_round(chooser, {1: 480.0, 2: 250.0})
    assert chooser.next_count() == 2 and not chooser.probing
    assert notes == ["threads: auto picked 2 (1: 480 us/step, 2: 250 us/step)"]


def test_repicks_when_a_core_is_taken_and_when_it_comes_back() -> None:
    clock = Clock()
    chooser = ThreadChooser([1, 2], clock=clock)
    run_round(chooser, {1: 480.0, 2: 250.0})
    chooser.record(10, 0.0025)  # within the re-probe interval: no new round
    assert not chooser.probing
    clock.now += REPROBE_SECONDS
    chooser.record(10, 0.0025)  # the interval has passed: the next chunks measure again
    assert chooser.probing
    assert run_round(chooser, {1: 480.0, 2: 1200.0}) == ["threads: auto picked 1 (1: 480 us/step, 2: 1,200 us/step)"]
    assert chooser.next_count() == 1
    clock.now += REPROBE_SECONDS
    chooser.record(10, 0.0048)
    run_round(chooser, {1: 480.0, 2: 250.0})
    assert chooser.next_count() == 2


def test_keeps_the_count_in_use_unless_another_is_clearly_faster() -> None:
    clock = Clock()
    chooser = ThreadChooser([1, 2], clock=clock)
    run_round(chooser, {1: 300.0, 2: 250.0})
    clock.now += REPROBE_SECONDS
    chooser.record(10, 0.0025)
    assert run_round(chooser, {1: 245.0, 2: 250.0}) == []  # 2% faster is noise
    assert chooser.next_count() == 2


def test_the_warm_up_chunk_after_a_switch_is_not_counted() -> None:
    chooser = ThreadChooser([1, 2], clock=Clock())
    chooser.record(10, 1.0)  # count 2's first chunk: very slow (thread start-up), ignored
    for _ in range(PROBE_CHUNKS):
        chooser.record(10, 0.0025)
    assert chooser.per_step[2] == pytest.approx(0.00025)


def test_one_candidate_never_probes_again() -> None:
    clock = Clock()
    chooser = ThreadChooser([1], clock=clock)
    run_round(chooser, {1: 100.0})
    clock.now += 10 * REPROBE_SECONDS
    chooser.record(10, 0.001)
    assert not chooser.probing and chooser.next_count() == 1


def test_bad_candidates_are_refused() -> None:
    with pytest.raises(ValueError):
        ThreadChooser([])
    with pytest.raises(ValueError):
        ThreadChooser([0, 2])


def test_auto_candidates_are_powers_of_two_and_the_core_count() -> None:
    assert auto_candidates(1) == [1]
    assert auto_candidates(2) == [1, 2]
    assert auto_candidates(6) == [1, 2, 4, 6]
    assert auto_candidates(16) == [1, 2, 4, 8, 16]


class _Session:
    def __init__(self) -> None:
        self.counts: list[int] = []

    def set_threads(self, n: int) -> int:
        self.counts.append(n)
        return n


def test_adaptive_threads_sets_counts_and_keeps_probe_chunks_short() -> None:
    session, clock = _Session(), Clock()
    adaptive = AdaptiveThreads(session, [1, 2], clock=clock)
    per_step = {1: 480e-6, 2: 1200e-6}  # a core taken by another process: 2 threads wait for it
    notes = []
    for _ in range(2 * (PROBE_CHUNKS + 1)):
        steps = adaptive.before_chunk(250, 400e-6)
        assert steps == int(PROBE_CHUNK_SECONDS / 400e-6)  # a round is under way: short chunks
        notes.append(adaptive.after_chunk(steps, steps * per_step[adaptive.in_use]))
    assert [n for n in notes if n] == ["threads: auto picked 1 (1: 480 us/step, 2: 1,200 us/step)"]
    assert session.counts == [2, 1]  # set only when the count changes
    assert adaptive.before_chunk(250, 480e-6) == 250 and session.counts == [2, 1]
