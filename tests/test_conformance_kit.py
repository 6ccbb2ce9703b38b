"""The conformance kit catches broken backends: deliberately wrong variants of numpy_ref must fail it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest
from eemicrogpt_backend_numpy.session import NumpySession

from eemicrogpt_core.backends.backend import BackendSpec, ProbeResult, TrainState
from eemicrogpt_core.backends.hookspec import hookimpl
from eemicrogpt_core.kit.conformance import REQUIRE_ENV, TRAINING_CHECKS, BackendConformance, relative_errors
from eemicrogpt_core.model.optim import DEFAULT_OPTIMIZER, OptimizerSettings
from eemicrogpt_core.model.shape import ModelShape


class GradientOff(NumpySession):
    """Gradients 0.1% too large (e.g. a wrong scale somewhere in the backward pass)."""

    def loss_and_grads(self, tokens, lengths, want_grads=True):
        loss, grads = super().loss_and_grads(tokens, lengths, want_grads)
        return loss, None if grads is None else grads * np.float32(1.001)


class OffByOne(NumpySession):
    """Drops each sequence's last live position (the one predicting the closing boundary)."""

    def loss_and_grads(self, tokens, lengths, want_grads=True):
        return super().loss_and_grads(tokens, self.dropped(lengths), want_grads)

    def train_steps(self, tokens, lengths, lrs):
        return super().train_steps(tokens, self.dropped(lengths), lrs)

    @staticmethod
    def dropped(lengths):
        return np.maximum(lengths - 1, 2).astype(np.uint16)


class LrOff(NumpySession):
    """Applies a learning rate 1% too large."""

    def train_steps(self, tokens, lengths, lrs):
        return super().train_steps(tokens, lengths, lrs * np.float32(1.01))


class StepOff(NumpySession):
    """Counts Adam steps one ahead, so the bias correction uses step + 1 (an off-by-one step counter)."""

    def train_steps(self, tokens, lengths, lrs):
        self._step += 1
        try:
            return super().train_steps(tokens, lengths, lrs)
        finally:
            self._step -= 1


class LrShift(NumpySession):
    """Applies each step the previous step's learning rate (an off-by-one LR schedule)."""

    def train_steps(self, tokens, lengths, lrs):
        return super().train_steps(tokens, lengths, np.concatenate([lrs[:1], lrs[:-1]]))


class Noisy(NumpySession):
    """Not deterministic: losses carry run-to-run noise."""

    def train_steps(self, tokens, lengths, lrs):
        losses = super().train_steps(tokens, lengths, lrs)
        return losses + np.random.default_rng().uniform(0, 1e-6, losses.shape).astype(np.float32)


class Leaky(NumpySession):
    """loss_and_grads counts as an update."""

    def loss_and_grads(self, tokens, lengths, want_grads=True):
        self._step += 1
        return super().loss_and_grads(tokens, lengths, want_grads)


class Aliased(NumpySession):
    """get_state hands out its live buffers instead of copies."""

    def get_state(self) -> TrainState:
        return TrainState(self._params, self._m, self._v, self._step)


class SkipsLastUpdate(NumpySession):
    """Computes every loss of a call but not the last Adam update (the step counter still says it did)."""

    def train_steps(self, tokens, lengths, lrs):
        n = len(lrs)
        losses = np.empty(n, np.float32)
        if n > 1:
            losses[:-1] = super().train_steps(tokens[:-1], lengths[:-1], lrs[:-1])
        losses[-1], _ = self.loss_and_grads(tokens[-1], lengths[-1], want_grads=False)
        self._step += 1
        return losses


class Float64State(NumpySession):
    """Hands out its state as float64 arrays."""

    def get_state(self) -> TrainState:
        state = super().get_state()
        return TrainState(*(a.astype(np.float64) for a in (state.params, state.adam_m, state.adam_v)), state.step)


class KeepsNonFinite(NumpySession):
    """Returns normally from a call whose update overflowed the parameters."""

    def _check_finite(self) -> None:
        pass


class VagueRefusal(NumpySession):
    """Refuses an overflowing update with an unrelated exception type instead of FloatingPointError."""

    def _check_finite(self) -> None:
        try:
            super()._check_finite()
        except FloatingPointError as exc:
            raise ValueError("something went wrong") from exc


class ListLosses(NumpySession):
    """Returns the losses as a Python list."""

    def train_steps(self, tokens, lengths, lrs):
        return super().train_steps(tokens, lengths, lrs).tolist()


class IgnoresClip(NumpySession):
    """Takes the optimiser's settings but never clips."""

    def set_optimizer(self, opt: OptimizerSettings) -> None:
        super().set_optimizer(dataclasses.replace(opt, grad_clip=0.0))


class IgnoresDecay(NumpySession):
    """Takes the optimiser's settings but never decays."""

    def set_optimizer(self, opt: OptimizerSettings) -> None:
        super().set_optimizer(dataclasses.replace(opt, weight_decay=0.0))


class IgnoresMoments(NumpySession):
    """Keeps the default betas and eps whatever it is given."""

    def set_optimizer(self, opt: OptimizerSettings) -> None:
        super().set_optimizer(dataclasses.replace(opt, beta1=DEFAULT_OPTIMIZER.beta1, beta2=DEFAULT_OPTIMIZER.beta2,
                                                  eps=DEFAULT_OPTIMIZER.eps))


class NoOptimizer(NumpySession):
    """A session from before the optimiser settings: no set_optimizer (None hides the inherited one from the
    protocol check, as __hash__ = None does for hashing)."""

    set_optimizer = None  # type: ignore[assignment]


MUTANTS = {
    cls.__name__.lower(): cls
    for cls in (GradientOff, OffByOne, LrOff, StepOff, LrShift, Noisy, Leaky, Aliased, SkipsLastUpdate,
                Float64State, KeepsNonFinite, VagueRefusal, ListLosses, IgnoresClip, IgnoresDecay, IgnoresMoments,
                NoOptimizer)
}


class MutantPlugin:
    @staticmethod
    @hookimpl
    def eemicrogpt_backends() -> Iterator[BackendSpec]:
        for name, cls in MUTANTS.items():
            yield BackendSpec(name, f"numpy_ref broken on purpose ({name})", lambda: ProbeResult.ok(0), cls)
        yield BackendSpec("unicorn", "never available", lambda: ProbeResult.no("needs a unicorn CPU"), NumpySession)


def kit(name: str, **attributes: object) -> BackendConformance:
    cls = type("Kit", (BackendConformance,), {
        "backend_name": name, "extra_plugins": (MutantPlugin,), "trajectory_steps": 30, **attributes,
    })
    return cls()


@pytest.mark.parametrize(
    "mutant,check",
    [
        ("gradientoff", "test_gradients_match_reference"),
        ("offbyone", "test_loss_matches_reference"),
        ("offbyone", "test_gradients_match_reference"),
        ("lroff", "test_one_adam_step_matches_reference"),
        ("offbyone", "test_loss_trajectory_matches_reference"),
        ("stepoff", "test_loss_trajectory_matches_reference"),
        ("lrshift", "test_loss_trajectory_matches_reference"),
        ("noisy", "test_determinism"),
        ("leaky", "test_loss_and_grads_leaves_state_unchanged"),
        ("aliased", "test_state_round_trip"),
        ("skipslastupdate", "test_chunked_calls_match_one_call"),
        ("float64state", "test_session_returns_declared_types"),
        ("keepsnonfinite", "test_non_finite_update_raises"),
        ("listlosses", "test_session_returns_declared_types"),
    ],
)
def test_kit_fails_a_broken_backend(mutant: str, check: str) -> None:
    with pytest.raises(AssertionError):
        getattr(kit(mutant), check)(16)


@pytest.mark.parametrize("mutant", ["gradientoff", "lroff", "stepoff", "lrshift", "noisy", "leaky", "aliased",
                                    "skipslastupdate", "float64state", "keepsnonfinite", "listlosses"])
def test_kit_passes_what_each_mutant_does_not_break(mutant: str) -> None:
    # Each mutant breaks one property; the loss check must still pass for those that keep the loss right.
    kit(mutant).test_loss_matches_reference(16)


@pytest.mark.parametrize(
    "check", ["test_chunked_calls_match_one_call", "test_session_returns_declared_types",
              "test_non_finite_update_raises"],
)
def test_new_contract_checks_pass_on_numpy_ref(check: str) -> None:
    # The mutants above fail these; the reference they were derived from passes them.
    getattr(kit("numpy_ref"), check)(16)


OPTIMIZER_CHECKS = ["test_optimizer_step_matches_reference", "test_optimizer_training_follows_reference"]
IGNORES = {"ignoresclip": "clip", "ignoresdecay": "decay", "ignoresmoments": "moments"}


@pytest.mark.parametrize("check", OPTIMIZER_CHECKS)
@pytest.mark.parametrize("mutant", list(IGNORES))
def test_kit_fails_a_backend_that_ignores_an_optimizer_setting(mutant: str, check: str) -> None:
    with pytest.raises(AssertionError, match=r"parameters are off|a loss in a window differs"):
        getattr(kit(mutant), check)(16, IGNORES[mutant])
    # ... and only the case of the setting it ignores: the others pass.
    for case in set(IGNORES.values()) - {IGNORES[mutant]}:
        getattr(kit(mutant), check)(16, case)


@pytest.mark.parametrize("check", OPTIMIZER_CHECKS)
def test_a_session_without_set_optimizer_skips_the_optimizer_checks(monkeypatch: pytest.MonkeyPatch,
                                                                    check: str) -> None:
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="nooptimizer: its sessions have no set_optimizer"):
        getattr(kit("nooptimizer"), check)(16, "clip")


def test_an_optimizer_case_that_changes_nothing_is_refused() -> None:
    # A clip far above the gradient's norm never engages: the check says so instead of passing vacuously.
    idle = kit("numpy_ref", optimizer_cases={"idle": OptimizerSettings(grad_clip=1e6)})
    for check in OPTIMIZER_CHECKS:
        with pytest.raises(AssertionError, match="does not engage"):
            getattr(idle, check)(16, "idle")
    tiny = kit("numpy_ref", optimizer_cases={"tiny": OptimizerSettings(weight_decay=1e-9)})
    with pytest.raises(AssertionError, match="the check could not fail"):
        tiny.test_optimizer_training_follows_reference(16, "tiny")


def test_optimizer_trajectories_need_a_window_with_adam_history() -> None:
    # Parameters are judged only in windows after step 0, so with one window the settings could not show.
    one_window = kit("numpy_ref", trajectory_steps=8, trajectory_windows=1)
    with pytest.raises(AssertionError, match="every trajectory window starts at step 0"):
        one_window.test_optimizer_training_follows_reference(16, "clip")


def test_non_finite_refusal_must_say_so() -> None:
    # Raising is not enough: the error must be the non-finite one, or a real bug would pass as a refusal.
    with pytest.raises(ValueError, match="something went wrong"):
        kit("vaguerefusal").test_non_finite_update_raises(16)


def test_float64_sessions_declare_their_state_dtype() -> None:
    kit("numpy_ref", dtype="float64", state_dtype="float64").test_session_returns_declared_types(16)
    with pytest.raises(AssertionError, match="not float32"):
        kit("numpy_ref", dtype="float64").test_session_returns_declared_types(16)


def test_unavailable_backend_is_skipped_with_its_probe_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="needs a unicorn CPU"):
        kit("unicorn").test_state_round_trip(16)


@pytest.mark.parametrize("required", ["unicorn", "avx512,unicorn", "all"])
def test_required_backend_that_is_unavailable_fails(monkeypatch: pytest.MonkeyPatch, required: str) -> None:
    monkeypatch.setenv(REQUIRE_ENV, required)
    with pytest.raises(pytest.fail.Exception, match=r"unicorn is required .* needs a unicorn CPU"):
        kit("unicorn").test_state_round_trip(16)


@pytest.mark.parametrize("required", ["", "no_such_backend"])
def test_uninstalled_backend_fails_never_skips(monkeypatch: pytest.MonkeyPatch, required: str) -> None:
    monkeypatch.setenv(REQUIRE_ENV, required)
    with pytest.raises(pytest.fail.Exception, match=r"no_such_backend is not installed .* install its package"):
        kit("no_such_backend").test_state_round_trip(16)


def test_uninstalled_backend_makes_the_run_fail(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from eemicrogpt_core.kit.conformance import BackendConformance

        class TestMissing(BackendConformance):
            backend_name = "no_such_backend"
            d_models = (16,)
        """
    )
    result = pytester.runpytest_inprocess("-q", "-k", "round_trip")
    result.assert_outcomes(errors=1)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*no_such_backend is not installed*"])


def test_unsupported_size_is_skipped_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EEMICROGPT_REQUIRE_BACKENDS", raising=False)  # CI requires numpy_ref: then it would fail
    with pytest.raises(pytest.skip.Exception, match="dtype float32, float64, not float16"):
        kit("numpy_ref", dtype="float16").test_state_round_trip(16)


def test_tolerances_follow_precision_unless_overridden() -> None:
    assert kit("numpy_ref").tol("grad_rel_rms") == 1e-5
    assert kit("numpy_ref", precision="fp16").tol("grad_rel_rms") == 3e-2
    assert kit("numpy_ref", precision="fp16", grad_rel_rms_tol=0.5).tol("grad_rel_rms") == 0.5
    with pytest.raises(ValueError, match="precision must be one of"):
        kit("numpy_ref", precision="int8").tol("loss_rel")


def test_relative_errors() -> None:
    want = np.array([1.0, -2.0, 0.0, 4.0])
    assert relative_errors(want, want) == (0.0, 0.0)
    rms, worst = relative_errors(want + np.array([0, 0, 0.04, 0]), want)
    assert worst == pytest.approx(0.01) and rms == pytest.approx(0.02 / np.sqrt(21 / 4))
    assert relative_errors(np.zeros(3), np.zeros(3)) == (0.0, 0.0)
    assert relative_errors(np.array([0.0, 1e-30]), np.zeros(2)) == (np.inf, np.inf)


def test_subclass_without_backend_name_is_an_error() -> None:
    with pytest.raises(TypeError, match="must set backend_name"):
        kit("").test_state_round_trip(16)


def test_kit_shapes_follow_heads_for() -> None:
    class EightHeads(BackendConformance):
        def heads_for(self, d_model: int) -> int:
            return 8

    assert EightHeads().shape(64) == ModelShape(64, 8)


def test_subclass_collects_per_size_and_honours_declared_skips(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from eemicrogpt_core.kit.conformance import BackendConformance

        class TestSmall(BackendConformance):
            backend_name = "numpy_ref"
            d_models = (16, 24)
            trajectory_steps = 3
            shape_matrix = ((16, 4, 2, 6, 5),)
            skip = {"covered elsewhere": ["test_determinism"]}

            def heads_for(self, d_model):
                return 4 if d_model == 16 else 3
        """
    )
    result = pytester.runpytest_inprocess("-q", "-rs", "-k", "round_trip or determinism or trajectory")
    # round trip and trajectory per d_model (2 + 2), the matrix's one shape (test_matrix_determinism);
    # test_determinism per d_model is the declared skip
    result.assert_outcomes(passed=5, skipped=2)
    result.stdout.fnmatch_lines(["*TestSmall*covered elsewhere*"])
    ids = pytester.runpytest_inprocess("-q", "--collect-only").stdout.str()
    assert "test_gradients_match_reference[d24]" in ids and "test_rejects_bad_input[lr_nan]" in ids
    assert "test_matrix_gradients_match_reference[d16h4L2V6C5]" in ids and "V256" not in ids


def test_training_d_models_narrow_only_the_multi_step_checks(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from eemicrogpt_core.kit.conformance import BackendConformance

        class TestNarrow(BackendConformance):
            backend_name = "numpy_ref"
            d_models = (16, 24)
            training_d_models = (16,)
        """
    )
    ids = pytester.runpytest_inprocess("-q", "--collect-only").stdout.str()
    for check in TRAINING_CHECKS:
        assert f"{check}[d16" in ids and f"{check}[d24" not in ids, check
    assert "test_gradients_match_reference[d24]" in ids and "test_optimizer_step_matches_reference[d24-clip]" in ids


def test_training_d_models_must_be_among_d_models(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from eemicrogpt_core.kit.conformance import BackendConformance

        class TestBad(BackendConformance):
            backend_name = "numpy_ref"
            d_models = (16,)
            training_d_models = (32,)
        """
    )
    result = pytester.runpytest_inprocess("-q", "--collect-only")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*TestBad.training_d_models [[]32[]] are not in d_models*"])
