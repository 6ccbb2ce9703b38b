"""Plugin discovery, isolation of broken plugins, and backend selection."""

from __future__ import annotations

import sys
import textwrap
import types

import numpy as np
import pytest

from eemicrogpt_core.backends.backend import BackendSpec, ProbeResult, TrainState
from eemicrogpt_core.backends.hookspec import hookimpl
from eemicrogpt_core.backends.registry import load_registry, open_session
from eemicrogpt_core.base.errors import BackendSelectionError, BatchError
from eemicrogpt_core.model.shape import ModelShape

SHAPE = ModelShape(16, 4)


class _NullSession:
    """Counts calls; returns zeros. Enough to see that validation happens before the backend."""

    def __init__(self, shape: ModelShape) -> None:
        self.calls = 0
        self.state = TrainState.fresh(np.zeros(shape.n_params, np.float32))

    def set_state(self, state):
        self.state = state.copy()

    def get_state(self):
        return self.state.copy()

    def train_steps(self, tokens, lengths, lrs):
        self.calls += 1
        return np.zeros(tokens.shape[0], np.float32)

    def loss_and_grads(self, tokens, lengths, want_grads=True):
        self.calls += 1
        return 0.0, None

    def close(self):
        pass


def _spec(
    name: str, *, available: bool = True, score: int = 10, d_models=None, reason: str = "", precision: str = "fp32"
) -> BackendSpec:
    probe = (lambda: ProbeResult.ok(score)) if available else (lambda: ProbeResult.no(reason or f"{name}: no"))
    return BackendSpec(name, f"{name} test backend", probe, lambda s, b, d: _NullSession(s), d_models=d_models,
                       precision=precision)


def _plugin(name: str, *specs: BackendSpec) -> types.ModuleType:
    module = types.ModuleType(name)

    @hookimpl
    def eemicrogpt_backends():
        yield from specs

    module.eemicrogpt_backends = eemicrogpt_backends
    return module


def _registry(*plugins):
    return load_registry(entry_points=False, extra_plugins=plugins)


def test_auto_picks_highest_score_that_supports_the_shape():
    reg = _registry(_plugin("p", _spec("slow", score=1), _spec("fast", score=100, d_models=(64,)), _spec("mid")))
    assert reg.auto_choice(SHAPE, 16).name == "mid"
    assert reg.auto_choice(ModelShape(64), 16).name == "fast"


def test_score_zero_is_never_auto():
    reg = _registry(_plugin("p", _spec("only_on_request", score=0)))
    with pytest.raises(BackendSelectionError, match="score 0"):
        reg.select(None, SHAPE, 16)
    assert reg.select("only_on_request", SHAPE, 16).name == "only_on_request"


def test_auto_never_picks_reduced_precision_unless_asked():
    reg = _registry(_plugin("p", _spec("fp32", score=10), _spec("fast_bf16", score=100, precision="bf16"),
                            _spec("slow_bf16", score=5, precision="bf16")))
    assert reg.select(None, SHAPE, 16).name == "fp32"
    assert reg.select("auto", SHAPE, 16, precision="fp32").name == "fp32"
    assert reg.select(None, SHAPE, 16, precision="bf16").name == "fast_bf16"
    with pytest.raises(BackendSelectionError,
                       match=r"precision=fp16 \(fast_bf16: computes in bf16; fp32: computes in fp32"):
        reg.select(None, SHAPE, 16, precision="fp16")


def test_named_backend_must_match_a_requested_precision():
    reg = _registry(_plugin("p", _spec("fp32"), _spec("half", precision="bf16")))
    assert reg.select("half", SHAPE, 16).name == "half"  # a name alone is a request for its precision
    assert reg.select("half", SHAPE, 16, precision="bf16").name == "half"
    with pytest.raises(BackendSelectionError,
                       match=r"'fp32' computes in fp32, not the requested precision bf16; bf16 backends available "
                             r"here: half"):
        reg.select("fp32", SHAPE, 16, precision="bf16")


def test_unknown_backend_lists_choices():
    reg = _registry(_plugin("p", _spec("a"), _spec("b")))
    with pytest.raises(BackendSelectionError, match=r"unknown backend 'zz'\. Choose one of: auto, a, b"):
        reg.select("zz", SHAPE, 16)


def test_unavailable_backend_says_why_and_what_is_available():
    reg = _registry(_plugin("p", _spec("a"), _spec("sme", available=False, reason="needs FEAT_SME2")))
    with pytest.raises(BackendSelectionError, match=r"'sme' is unavailable: needs FEAT_SME2\. Available here: a"):
        reg.select("sme", SHAPE, 16)


def test_explicit_choice_that_cannot_run_the_shape_is_an_error_not_a_fallback():
    reg = _registry(_plugin("p", _spec("a"), _spec("big", d_models=(64, 128))))
    with pytest.raises(BackendSelectionError, match="supports d_model 64, 128, not 16"):
        reg.select("big", SHAPE, 16)


def test_a_refused_shape_names_only_the_backends_that_can_run_it():
    reg = _registry(_plugin("p", _spec("a"), _spec("big", d_models=(64, 128)), _spec("wide", d_models=(64,))))
    with pytest.raises(BackendSelectionError, match=r"not 16\. Backends here that can: a$"):
        reg.select("big", SHAPE, 16)
    only_big = _registry(_plugin("p", _spec("big", d_models=(64, 128)), _spec("wide", d_models=(64,))))
    with pytest.raises(BackendSelectionError, match=r"Backends here that can: none$"):
        only_big.select("big", SHAPE, 16)


def test_no_backend_installed_says_what_to_install():
    reg = _registry()
    with pytest.raises(BackendSelectionError, match="pip install"):
        reg.select(None, SHAPE, 16)


def test_broken_plugins_are_reported_and_others_keep_working():
    def boom():
        raise RuntimeError("cpuid exploded")

    raising_probe = BackendSpec("flaky", "d", boom, lambda s, b, d: None)
    raising_hook = types.ModuleType("raising_hook")

    @hookimpl
    def eemicrogpt_backends():
        raise ImportError("libfoo.so missing")

    raising_hook.eemicrogpt_backends = eemicrogpt_backends
    garbage = types.ModuleType("garbage")
    garbage.eemicrogpt_backends = hookimpl(lambda: ["not a spec"])
    misspelled = types.ModuleType("misspelled")
    misspelled.eemicrogpt_backendz = hookimpl(lambda: [])

    reg = _registry(_plugin("good", _spec("ok"), raising_probe), raising_hook, garbage, misspelled)
    assert [e.name for e in reg.available()] == ["ok"]
    assert "cpuid exploded" in reg.get("flaky").status_reason
    errors = {f.plugin: f.error for f in reg.failures}
    assert "libfoo.so missing" in errors["raising_hook"]
    assert "not a BackendSpec" in errors["garbage"]
    assert "eemicrogpt_backendz" in errors["misspelled"]
    with pytest.raises(BackendSelectionError, match="broken: probe raised RuntimeError: cpuid exploded"):
        reg.select("flaky", SHAPE, 16)


def _fake_distribution(tmp_path, name: str, entry_points: str) -> None:
    info = tmp_path / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))


def test_entry_point_that_fails_to_import_is_isolated(tmp_path, monkeypatch):
    (tmp_path / "goodplug.py").write_text(textwrap.dedent("""
        from eemicrogpt_core.backends.backend import BackendSpec, ProbeResult
        from eemicrogpt_core.backends.hookspec import hookimpl

        @hookimpl
        def eemicrogpt_backends():
            yield BackendSpec("from_ep", "d", lambda: ProbeResult.ok(5), lambda s, b, d: None)
    """))
    _fake_distribution(tmp_path, "good-plug", "[eemicrogpt.backends]\ngood = goodplug\n")
    _fake_distribution(tmp_path, "bad-plug", "[eemicrogpt.backends]\nbad = no_such_module_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = load_registry()
    entry = reg.get("from_ep")
    assert entry is not None and entry.available and entry.distribution == "good-plug"
    failure = next(f for f in reg.failures if f.plugin == "bad")
    assert failure.distribution == "bad-plug" and "No module named 'no_such_module_xyz'" in failure.error
    monkeypatch.setenv("EEMICROGPT_DISABLE_PLUGINS", "bad,good")
    reg = load_registry()
    assert reg.get("from_ep") is None and not any(f.plugin == "bad" for f in reg.failures)
    sys.modules.pop("goodplug", None)


def _batch(batch=4, shape=SHAPE):
    tokens = np.zeros((batch, shape.seq_len), np.uint8)
    lengths = np.full(batch, 5, np.uint16)
    return tokens, lengths


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t, n: (t.astype(np.int64), n), "dtype uint8"),
        (lambda t, n: (t[:, :8].copy(), n), r"17 positions per sequence \(context 16 \+ 1\)"),
        (lambda t, n: (np.full_like(t, 27), n), r"token 27 is out of range: the vocabulary has 27 tokens"),
        (lambda t, n: (t, np.full_like(n, 1)), "length 1 is outside 2..17"),
        (lambda t, n: (t, np.full_like(n, 18)), "length 18 is outside 2..17"),
        (lambda t, n: (t, n[:2].copy()), "disagree"),
        (lambda t, n: (np.zeros((9, 17), np.uint8), np.full(9, 3, np.uint16)),
         "exceeds the capacity of 8 the backend session"),
        (lambda t, n: (t.tolist(), n), "must be a numpy array"),
    ],
)
def test_bad_batches_never_reach_the_backend(mutate, message):
    reg = _registry(_plugin("p", _spec("a")))
    session = open_session(reg.get("a"), SHAPE, max_batch=8)
    tokens, lengths = mutate(*_batch())
    with pytest.raises(BatchError, match=message):
        session.loss_and_grads(tokens, lengths)
    assert session.inner.calls == 0


SMALL = ModelShape(16, 4, n_layers=2, vocab=6, context=5)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t, n: (np.zeros((4, 17), np.uint8), n), r"6 positions per sequence \(context 5 \+ 1\)"),
        (lambda t, n: (np.full_like(t, 6), n), r"token 6 is out of range: the vocabulary has 6 tokens \(0\.\.5\)"),
        (lambda t, n: (t, np.full_like(n, 7)), "length 7 is outside 2..6"),
    ],
)
def test_batches_are_checked_against_the_sessions_shape(mutate, message):
    reg = _registry(_plugin("p", _spec("a")))
    session = open_session(reg.get("a"), SMALL, max_batch=8)
    tokens, lengths = _batch(shape=SMALL)
    session.loss_and_grads(tokens, lengths)  # the unmutated batch is fine: 6 positions, tokens < 6
    tokens, lengths = mutate(tokens, lengths)
    with pytest.raises(BatchError, match=message):
        session.loss_and_grads(tokens, lengths)
    assert session.inner.calls == 1


def test_bad_learning_rates_are_rejected():
    reg = _registry(_plugin("p", _spec("a")))
    session = open_session(reg.get("a"), SHAPE, max_batch=8)
    tokens, lengths = _batch()
    for lrs, message in [
        (np.array([np.nan], np.float32), "finite"),
        (np.array([0.1, 0.1], np.float32), "one learning rate per step"),
        (np.array([0.1]), "dtype float32"),
    ]:
        with pytest.raises(BatchError, match=message):
            session.train_steps(tokens[None], lengths[None], lrs)
    assert session.inner.calls == 0
    assert session.train_steps(tokens[None], lengths[None], np.array([0.1], np.float32)).shape == (1,)
