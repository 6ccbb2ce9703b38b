"""threads: auto's chooser, driven by a fake clock and chosen step times (no real threads, no timing)."""

from __future__ import annotations

import pytest

from eemicrogpt_core.adaptive_threads import PROBE_CHUNKS, REPROBE_SECONDS, ThreadChooser


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
