"""The hook spec against the registry: every declared hook is documented, a plugin implementing the hooks is
found and each hook is called with the arguments its spec declares; an implementation whose signature does not
fit the spec, or a hook the spec does not declare, is rejected; the superseded fp32 hook is never called."""

from __future__ import annotations

import inspect
import types
import warnings
from typing import Any

import pytest

from eemicrogpt_core.backends import hookspec
from eemicrogpt_core.backends.backend import BackendSpec, ProbeResult
from eemicrogpt_core.backends.hookspec import hookimpl
from eemicrogpt_core.backends.registry import load_registry, peak_gflops

HOOKS = {
    name: fn for name, fn in inspect.getmembers(hookspec, inspect.isfunction)
    if hasattr(fn, f"{hookspec.PROJECT}_spec")
}
SUPERSEDED = {"eemicrogpt_fp32_peak_gflops"}  # declared so older plugins load; the registry never calls it
Calls = dict[str, list[dict[str, Any]]]


def _params(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


def _spec(name: str, precision: str = "fp32") -> BackendSpec:
    return BackendSpec(name, f"{name} test backend", lambda: ProbeResult.ok(50), lambda s, b, d: None,
                       precision=precision)


def _recording_plugin(calls: Calls) -> types.ModuleType:
    """A plugin implementing every hook the registry calls, each recording the arguments it was given."""
    module = types.ModuleType("recording")

    @hookimpl
    def eemicrogpt_backends() -> list[BackendSpec]:
        calls.setdefault("eemicrogpt_backends", []).append({})
        return [_spec("rec32"), _spec("rec16", precision="bf16")]

    @hookimpl
    def eemicrogpt_peak_gflops(precision: str, seconds: float) -> float:
        calls.setdefault("eemicrogpt_peak_gflops", []).append({"precision": precision, "seconds": seconds})
        return {"fp32": 40.0, "bf16": 160.0}[precision]

    module.eemicrogpt_backends = eemicrogpt_backends
    module.eemicrogpt_peak_gflops = eemicrogpt_peak_gflops
    return module


def test_the_recording_plugin_implements_each_live_hook_with_its_declared_signature() -> None:
    plugin = _recording_plugin({})
    implemented = {name for name in HOOKS if hasattr(plugin, name)}
    assert implemented == set(HOOKS) - SUPERSEDED, "a hook was added to the spec: make the registry test call it"
    for name in implemented:
        assert _params(getattr(plugin, name)) == _params(HOOKS[name]), name


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_hook_is_documented(hook: str) -> None:
    doc = inspect.getdoc(HOOKS[hook]) or ""
    assert len(doc.split()) >= 10, f"{hook} needs a docstring saying what a plugin returns"


def test_the_registry_finds_the_plugin_and_calls_each_hook_with_the_declared_arguments() -> None:
    calls: Calls = {}
    reg = load_registry(entry_points=False, extra_plugins=[_recording_plugin(calls)])
    assert reg.failures == []
    assert sorted(e.name for e in reg.entries) == ["rec16", "rec32"]
    assert {e.plugin for e in reg.entries} == {"recording"}
    assert calls == {"eemicrogpt_backends": [{}]}  # collected once, at load; the peak only when asked
    fp32, bf16 = peak_gflops(reg, seconds=0.25), peak_gflops(reg, seconds=0.5, precision="bf16")
    assert fp32 is not None and fp32.gflops == 40.0 and "plugin of rec32" in fp32.source
    assert bf16 is not None and bf16.gflops == 160.0 and "plugin of rec16" in bf16.source
    assert calls["eemicrogpt_peak_gflops"] == [{"precision": "fp32", "seconds": 0.25},
                                               {"precision": "bf16", "seconds": 0.5}]
    assert set(calls) == set(HOOKS) - SUPERSEDED


def _plugin_with(name: str, fn: Any) -> types.ModuleType:
    module = types.ModuleType(f"bad_{name}")
    module.eemicrogpt_backends = hookimpl(lambda: [_spec(f"from_{name}")])
    setattr(module, name, hookimpl(fn))
    return module


@pytest.mark.parametrize(("hook", "fn", "says"), [
    ("eemicrogpt_peak_gflops", lambda precision, seconds, cores: 1.0, "cores"),  # an argument the spec lacks
    ("eemicrogpt_peak_gflop", lambda precision, seconds: 1.0, "unknown hook"),  # a misspelled hook
])
def test_an_implementation_that_does_not_fit_the_spec_is_rejected(hook: str, fn: Any, says: str) -> None:
    reg = load_registry(entry_points=False, extra_plugins=[_plugin_with(hook, fn)])
    assert [f.plugin for f in reg.failures] == [f"bad_{hook}"]
    assert says in reg.failures[0].error and hook in reg.failures[0].error
    assert reg.entries == []  # nothing of the rejected plugin is listed


def test_the_superseded_fp32_hook_loads_with_a_warning_and_is_never_called() -> None:
    called: list[float] = []
    plugin = _plugin_with("eemicrogpt_fp32_peak_gflops", lambda seconds: called.append(seconds) or 99.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reg = load_registry(entry_points=False, extra_plugins=[plugin])
    assert reg.failures == [] and [e.name for e in reg.entries] == ["from_eemicrogpt_fp32_peak_gflops"]
    assert any(issubclass(w.category, DeprecationWarning) and "eemicrogpt_peak_gflops" in str(w.message)
               for w in caught)
    assert peak_gflops(reg) is None and called == []
