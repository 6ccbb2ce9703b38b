"""--time-budget with threads: auto sizes the run by the thread count it will train on.

The trial's case: on a machine where another process held a core, the warm-up timed all cores (slow: each step
waited for the busy one) while threads: auto then trained on one core, several times faster, so the run
finished its steps in a tenth of the budget. Timing is not asserted on this shared machine; the mechanism is,
with a fake session whose steps cost a known time per thread count on a fake clock, and with a real backend
whose estimate must end on the count the run then uses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eemicrogpt_core.backends.adaptive_threads import REPROBE_SECONDS, AdaptiveThreads
from eemicrogpt_core.backends.backend import TrainState
from eemicrogpt_core.backends.registry import BackendRegistry
from eemicrogpt_core.data.names import encode, read_names, split
from eemicrogpt_core.model.vocab import Vocabulary
from eemicrogpt_core.training.config import TrainConfig
from eemicrogpt_core.training.trainer import estimate_steps, train

# A core taken by another process: two threads wait for it, one thread runs alone at full speed.
COST_S = {1: 40e-6, 2: 400e-6}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeSession:
    """Each step takes COST_S[threads] on the clock; nothing is computed."""

    def __init__(self, clock: Clock, threads: int = 2) -> None:
        self.clock, self.threads = clock, threads
        self.state = TrainState.fresh(np.zeros(4, np.float32))
        self.steps_by_count: dict[int, int] = {}

    def get_state(self) -> TrainState:
        return self.state

    def set_state(self, state: TrainState) -> None:
        self.state = state

    def set_threads(self, n: int) -> int:
        self.threads = n
        return n

    def train_steps(self, tokens: Any, lengths: Any, lrs: Any) -> np.ndarray:
        n = len(lrs)
        self.clock.now += n * COST_S[self.threads]
        self.steps_by_count[self.threads] = self.steps_by_count.get(self.threads, 0) + n
        return np.zeros(n, np.float32)


@pytest.fixture(scope="module")
def dataset(names_file: Path) -> Any:
    names = read_names(names_file)
    return split(encode(names.names, Vocabulary.from_names(names.names), 16)[0], 0.1, 0).train


@pytest.mark.parametrize("budget", [1.0, 5.0, 60.0])
def test_the_estimate_times_every_count_and_sizes_the_run_by_the_fastest(budget: float, dataset: Any) -> None:
    clock = Clock()
    session = FakeSession(clock)
    adaptive = AdaptiveThreads(session, [1, 2], clock=clock)
    steps, fastest = estimate_steps(session, dataset, TrainConfig(d_model=16), budget, adaptive, clock=clock)
    assert set(session.steps_by_count) == {1, 2}  # both counts were timed
    # the run is sized by one thread's speed (to the rounding of a chunk's time over its steps) ...
    assert abs(steps - budget / COST_S[1]) <= 1
    assert session.threads == 1 and adaptive.in_use == 1  # ... and starts on one thread
    assert adaptive.chooser.chosen == 1 and not adaptive.chooser.probing  # no round right away
    assert adaptive.before_chunk(500, COST_S[1]) == 500 and session.threads == 1
    assert fastest == pytest.approx(COST_S[1])
    # The warm-up stays within its share of the budget: a tenth (at most one second) for all counts together,
    # plus one doubling chunk per count past its share.
    assert clock.now <= min(0.1 * budget, 1.0) * 2 + 0.01
    clock.now += REPROBE_SECONDS  # later the counts are timed again, as for any threads: auto run
    adaptive.after_chunk(500, 500 * COST_S[1])
    assert adaptive.chooser.probing


def test_a_fixed_thread_count_is_timed_alone(dataset: Any) -> None:
    clock = Clock()
    session = FakeSession(clock, threads=2)
    steps, _ = estimate_steps(session, dataset, TrainConfig(d_model=16), 1.0, None, clock=clock)
    assert set(session.steps_by_count) == {2} and abs(steps - 1.0 / COST_S[2]) <= 1


def test_a_real_time_budget_run_trains_on_the_count_it_was_sized_for(registry: BackendRegistry, names_file: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A real backend with threads: auto: the count the estimate settles on is the one the first chunks use."""
    entry = next((registry.get(n) for n in ("avx512", "avx2") if registry.get(n) and registry.get(n).available),
                 None)
    if entry is None or entry.spec is None or not entry.spec.thread_independent:
        pytest.skip("needs a thread-independent multi-threaded backend (x86)")
    from eemicrogpt_core.training import trainer

    seen: list[tuple[int | None, int | None]] = []
    original = trainer.estimate_steps

    def spy(session: Any, data: Any, cfg: Any, budget: float, threads: Any = None, **kw: Any) -> Any:
        result = original(session, data, cfg, budget, threads, **kw)
        seen.append((threads.chooser.chosen if threads else None, threads.in_use if threads else None))
        return result

    monkeypatch.setattr(trainer, "estimate_steps", spy)
    cfg = TrainConfig(d_model=16, backend=entry.name, data=str(names_file), time_budget=0.3, log_every=10**6,
                      out=None)
    result = train(cfg, registry)
    if len(seen) == 0 or seen[0] == (None, None):
        pytest.skip("only one core here: threads: auto has a single count")
    chosen, in_use = seen[0]
    assert chosen == in_use
    assert result.total_steps >= 1


class WarmingSession(FakeSession):
    """A backend whose first calls cost more than the run's long chunks will: a fixed cost per call (a thread
    wake-up) and a slower first ten milliseconds of steps (cold caches), then STEADY_S per step."""

    STEADY_S, PER_CALL_S, COLD_S = 25e-6, 300e-6, 0.01

    def train_steps(self, tokens: Any, lengths: Any, lrs: Any) -> np.ndarray:
        n = len(lrs)
        cold = 1.5 if self.clock.now < self.COLD_S else 1.0
        self.clock.now += self.PER_CALL_S + n * self.STEADY_S * cold
        return np.zeros(n, np.float32)


@pytest.mark.parametrize("budget", [1.0, 5.0])
def test_the_estimate_is_the_steady_speed_not_the_first_calls(budget: float, dataset: Any) -> None:
    """Sized by the first small chunks, a 1 s run on two x86 threads trained 0.82 s; the steady chunks the
    estimate now times are within the per-call cost of the run's 250-step chunks of the true speed."""
    clock = Clock()
    session = WarmingSession(clock)
    steps, _ = estimate_steps(session, dataset, TrainConfig(d_model=16), budget, None, clock=clock)
    run_per_step = WarmingSession.STEADY_S + WarmingSession.PER_CALL_S / 250  # the run's chunks of 250 steps
    assert steps * run_per_step == pytest.approx(budget, rel=0.10)


class SlowingSession(FakeSession):
    """Steps that cost `per_step` seconds until `slow_after` seconds into the run, then `factor` times as much:
    a machine that got busier (factor > 1) or quieter (< 1) after the warm-up sized the run."""

    def __init__(self, clock: Clock, per_step: float, slow_after: float, factor: float) -> None:
        super().__init__(clock, threads=1)
        self.per_step, self.slow_after, self.factor = per_step, slow_after, factor

    def train_steps(self, tokens: Any, lengths: Any, lrs: Any) -> np.ndarray:
        n = len(lrs)
        cost = self.per_step * (self.factor if self.clock.now >= self.slow_after else 1.0)
        self.clock.now += n * cost
        self.state = TrainState(self.state.params, self.state.adam_m, self.state.adam_v, self.state.step + n)
        return np.full(n, 2.0, np.float32)

    def loss_and_grads(self, tokens: Any, lengths: Any, want_grads: bool = True) -> tuple[float, None]:
        return 2.0, None

    def close(self) -> None:
        pass


@pytest.mark.parametrize("factor", [2.0, 0.5, 1.0])
def test_a_time_budget_run_trains_for_its_budget_when_the_speed_changes(factor: float, names_file: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm-up sizes the run; a speed change right after it (a core taken or freed) would make the run
    train factor x its budget. The run re-sizes its total from its own chunks while it is young and ends
    within 10% of the budget in training seconds."""
    import types

    from eemicrogpt_core.backends.backend import BackendSpec, ProbeResult
    from eemicrogpt_core.backends.hookspec import hookimpl
    from eemicrogpt_core.backends.registry import load_registry
    from eemicrogpt_core.training import trainer

    clock, budget = Clock(), 1.0
    warmup_end = min(0.1 * budget, 1.0) + 0.01  # estimate_steps' measuring time, and a little more

    def factory(shape: Any, max_batch: int, dtype: str) -> SlowingSession:
        return SlowingSession(clock, 50e-6, clock.now + warmup_end, factor)

    plugin = types.ModuleType("clocked")
    plugin.eemicrogpt_backends = hookimpl(lambda: [BackendSpec("clocked", "d", lambda: ProbeResult.ok(1), factory)])
    monkeypatch.setattr(trainer, "time", types.SimpleNamespace(perf_counter=clock))  # the warm-up's and the run's
    cfg = TrainConfig(d_model=16, backend="clocked", data=str(names_file), time_budget=budget, log_every=10**6,
                      out=None)
    result = train(cfg, load_registry(entry_points=False, extra_plugins=[plugin]))
    assert result.train_seconds == pytest.approx(budget, rel=0.10)
    assert result.losses.size == result.total_steps  # it ran the total it settled on
