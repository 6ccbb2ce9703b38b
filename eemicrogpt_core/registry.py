"""Backend discovery and selection.

Plugins come from the `eemicrogpt.backends` entry-point group (and, for tests, `extra_plugins`). Each entry point
is loaded on its own inside try/except, as conda does: a plugin that fails to import, registers a bad hook,
yields garbage or raises from its probe is recorded with its error and never breaks the others or the CLI.
Selection never falls back silently: an explicit choice that cannot run is an error saying why.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata

import pluggy

from . import hookspec
from .backend import BackendSpec, ProbeResult
from .errors import BackendSelectionError
from .model import ModelShape
from .threads import apply_threads
from .validate import ValidatedSession

DISABLE_ENV = "EEMICROGPT_DISABLE_PLUGINS"  # comma-separated entry-point or backend names to skip
NO_AUTOLOAD_ENV = "EEMICROGPT_NO_PLUGIN_AUTOLOAD"  # "1": ignore installed entry points entirely
INSTALL_HINT = (
    "install one, e.g. `pip install ./backends/numpy_ref` (portable reference) or `pip install ./backends/x86` "
    "(AVX-512/AVX2) from a source checkout"
)


@dataclass
class PluginFailure:
    plugin: str
    distribution: str
    error: str


@dataclass
class BackendEntry:
    name: str
    spec: BackendSpec | None
    distribution: str
    version: str
    probe: ProbeResult | None = None
    error: str | None = None  # the probe raised: the backend is broken, not merely unavailable

    @property
    def available(self) -> bool:
        return self.error is None and self.probe is not None and self.probe.available

    @property
    def score(self) -> int:
        return self.probe.score if self.available and self.probe else 0

    @property
    def status_reason(self) -> str:
        if self.error is not None:
            return f"broken: {self.error}"
        return self.probe.reason if self.probe else ""


@dataclass
class BackendRegistry:
    entries: list[BackendEntry] = field(default_factory=list)
    failures: list[PluginFailure] = field(default_factory=list)
    plugin_manager: pluggy.PluginManager | None = None

    def get(self, name: str) -> BackendEntry | None:
        return next((e for e in self.entries if e.name == name), None)

    def available(self) -> list[BackendEntry]:
        return [e for e in self.entries if e.available]

    def _available_names(self) -> str:
        names = [e.name for e in self.available()]
        return ", ".join(names) if names else "none"

    def auto_choice(self, shape: ModelShape, batch: int, dtype: str = "float32") -> BackendEntry | None:
        """The highest-scoring available backend that supports this configuration (score 0 never wins)."""
        candidates = [
            e for e in self.available()
            if e.score > 0 and e.spec is not None and e.spec.unsupported_reason(shape, batch, dtype) is None
        ]
        return max(candidates, key=lambda e: (e.score, e.name), default=None)

    def select(
        self, requested: str | None, shape: ModelShape, batch: int, dtype: str = "float32"
    ) -> BackendEntry:
        if requested in (None, "", "auto"):
            return self._select_auto(shape, batch, dtype)
        entry = self.get(requested)
        if entry is None:
            known = ", ".join(e.name for e in self.entries) or "none installed"
            raise BackendSelectionError(
                f"unknown backend '{requested}'. Choose one of: auto, {known}"
                if self.entries else f"unknown backend '{requested}': no backend is installed; {INSTALL_HINT}"
            )
        if not entry.available:
            raise BackendSelectionError(
                f"backend '{requested}' is unavailable: {entry.status_reason}. "
                f"Available here: {self._available_names()}"
            )
        assert entry.spec is not None
        reason = entry.spec.unsupported_reason(shape, batch, dtype)
        if reason is not None:
            raise BackendSelectionError(
                f"backend '{requested}' cannot run this configuration: {reason}. "
                f"Available here: {self._available_names()}"
            )
        return entry

    def _select_auto(self, shape: ModelShape, batch: int, dtype: str) -> BackendEntry:
        choice = self.auto_choice(shape, batch, dtype)
        if choice is not None:
            return choice
        if not self.entries:
            raise BackendSelectionError(f"no eemicrogpt backend is installed: {INSTALL_HINT}")
        reasons = []
        for e in self.entries:
            if e.spec is None:
                continue
            reason = e.spec.unsupported_reason(shape, batch, dtype) if e.available else e.status_reason
            reasons.append(f"{e.name}: {reason or 'never chosen automatically (score 0)'}")
        why = "; ".join(reasons)
        raise BackendSelectionError(
            f"no available backend can run d_model={shape.d_model}, n_heads={shape.n_heads}, batch={batch}, "
            f"dtype={dtype} ({why})"
        )


def _disabled_names() -> set[str]:
    return {name.strip() for name in os.environ.get(DISABLE_ENV, "").split(",") if name.strip()}


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _new_plugin_manager() -> pluggy.PluginManager:
    manager = pluggy.PluginManager(hookspec.PROJECT)
    manager.add_hookspecs(hookspec)
    return manager


def _register(manager: pluggy.PluginManager, plugin: object, name: str) -> str | None:
    """Register one plugin; returns an error string instead of raising."""
    try:
        manager.register(plugin, name=name)
        manager.check_pending()  # misspelled hooks are errors, not silent no-ops
    except Exception as exc:
        if manager.is_registered(plugin):
            manager.unregister(plugin)
        return _describe(exc)
    return None


def _load_entry_points(
    manager: pluggy.PluginManager, failures: list[PluginFailure], origin: dict[str, tuple[str, str]]
) -> None:
    disabled = _disabled_names()
    seen: dict[str, str] = {}
    for ep in metadata.entry_points(group=hookspec.ENTRY_POINT_GROUP):
        dist_name = ep.dist.name if ep.dist else "unknown"
        dist_version = ep.dist.version if ep.dist else ""
        if ep.name in disabled:
            continue
        if ep.name in seen:
            failures.append(PluginFailure(
                ep.name, dist_name, f"duplicate plugin name '{ep.name}', also provided by {seen[ep.name]}"
            ))
            continue
        seen[ep.name] = dist_name
        try:
            plugin = ep.load()
        except Exception as exc:
            failures.append(PluginFailure(ep.name, dist_name, f"import failed: {_describe(exc)}"))
            continue
        error = _register(manager, plugin, ep.name)
        if error:
            failures.append(PluginFailure(ep.name, dist_name, error))
            continue
        origin[ep.name] = (dist_name, dist_version)


def _collect_specs(
    manager: pluggy.PluginManager, failures: list[PluginFailure], origin: dict[str, tuple[str, str]]
) -> list[BackendEntry]:
    """Call each plugin's hook separately so that one raising plugin cannot hide the others."""
    disabled = _disabled_names()
    entries: dict[str, BackendEntry] = {}
    for impl in manager.hook.eemicrogpt_backends.get_hookimpls():
        dist, version = origin.get(impl.plugin_name, (impl.plugin_name, ""))
        try:
            specs = list(impl.function() or ())
        except Exception as exc:
            failures.append(PluginFailure(impl.plugin_name, dist, f"eemicrogpt_backends() raised {_describe(exc)}"))
            continue
        for spec in specs:
            if not isinstance(spec, BackendSpec):
                failures.append(PluginFailure(
                    impl.plugin_name, dist, f"yielded {type(spec).__name__}, not a BackendSpec"
                ))
                continue
            if spec.name in disabled:
                continue
            if spec.name in entries:
                failures.append(PluginFailure(
                    impl.plugin_name, dist,
                    f"backend name '{spec.name}' is already provided by {entries[spec.name].distribution}",
                ))
                continue
            entries[spec.name] = BackendEntry(spec.name, spec, dist, version)
    return sorted(entries.values(), key=lambda e: e.name)


def _probe(entry: BackendEntry) -> None:
    assert entry.spec is not None
    try:
        result = entry.spec.probe()
        if not isinstance(result, ProbeResult):
            raise TypeError(f"probe returned {type(result).__name__}, not a ProbeResult")
        entry.probe = result
    except Exception as exc:
        entry.error = f"probe raised {_describe(exc)}"


def load_registry(*, entry_points: bool = True, extra_plugins: Iterable[object] = ()) -> BackendRegistry:
    manager = _new_plugin_manager()
    failures: list[PluginFailure] = []
    origin: dict[str, tuple[str, str]] = {}
    if entry_points and os.environ.get(NO_AUTOLOAD_ENV) != "1":
        _load_entry_points(manager, failures, origin)
    for index, plugin in enumerate(extra_plugins):
        name = getattr(plugin, "__name__", None) or f"extra-plugin-{index}"
        error = _register(manager, plugin, name)
        if error:
            failures.append(PluginFailure(name, "(in-process)", error))
        else:
            origin[name] = ("(in-process)", "")
    entries = _collect_specs(manager, failures, origin)
    for entry in entries:
        _probe(entry)
    return BackendRegistry(entries, failures, manager)


def open_session(
    entry: BackendEntry, shape: ModelShape, max_batch: int, dtype: str = "float32", threads: int | None = None
) -> ValidatedSession:
    """Instantiate a backend session for this shape, wrapped so every input is validated first.

    threads: threads per step where the backend can split one (None: the physical cores, see threads.py).
    """
    if not entry.available or entry.spec is None:
        raise BackendSelectionError(f"backend '{entry.name}' is unavailable: {entry.status_reason}")
    reason = entry.spec.unsupported_reason(shape, max_batch, dtype)
    if reason is not None:
        raise BackendSelectionError(f"backend '{entry.name}' cannot run this configuration: {reason}")
    try:
        inner = entry.spec.factory(shape, max_batch, dtype)
    except Exception as exc:
        raise BackendSelectionError(f"backend '{entry.name}' failed to start: {_describe(exc)}") from exc
    session = ValidatedSession(inner, shape, max_batch, entry.name)
    try:
        session.threads = apply_threads(inner, threads)
    except Exception as exc:
        inner.close()
        wanted = threads if threads is not None else "its default number of"
        raise BackendSelectionError(f"backend '{entry.name}' cannot run {wanted} threads: {_describe(exc)}") from exc
    return session


def peak_gflops(registry: BackendRegistry, seconds: float = 0.3) -> float | None:
    """This core's FP32 FMA peak as measured by a plugin's microbenchmark, or None if none can."""
    if registry.plugin_manager is None:
        return None
    try:
        return registry.plugin_manager.hook.eemicrogpt_fp32_peak_gflops(seconds=seconds)
    except Exception:
        return None
