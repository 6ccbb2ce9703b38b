"""Backend discovery and selection.

Plugins come from the `eemicrogpt.backends` entry-point group (and, for tests, `extra_plugins`). Each entry point
is loaded on its own inside try/except, as conda does: a plugin that fails to import, registers a bad hook,
yields garbage (a spec of the wrong types) or whose probe raises or hangs (each probe runs with a deadline, see
plugin_guard) is recorded with its error and never breaks the others or the CLI.
Selection never falls back silently: an explicit choice that cannot run is an error saying why.

Probes run when first needed, so a command probes only what it uses: a backend chosen by name probes that
one, `auto` and listings probe all (at once, saying which is slow while waiting). A probe or hook of an
installed plugin that hung is remembered (probe_memory) and not called again for a day.

Backend names are unique or explicit: when two distributions provide the same name, neither replaces the
other (whatever the hook order or path order); both are listed, `auto` picks neither, and the user chooses
one as `distribution:name` (e.g. `--backend eemicrogpt-backend-x86:avx512`, or in $EEMICROGPT_BACKEND).
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy

from ..base.errors import BackendSelectionError
from ..model.shape import ModelShape
from . import hookspec, plugin_guard, probe_memory
from .backend import BackendSpec, ProbeResult
from .precision import FP32, wanted
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


def normalize(name: str) -> str:
    """Distribution names compare as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class BackendEntry:
    name: str
    spec: BackendSpec | None
    distribution: str
    version: str
    probe: ProbeResult | None = None
    error: str | None = None  # the probe raised, hung or the spec is malformed: broken, not merely unavailable
    plugin: str = ""  # the registered plugin that yielded it: entry-point name, or `distribution:entry point`
    also_provided_by: list[str] = field(default_factory=list)  # the other providers of this name
    qualifier: str = ""  # what goes before ':' to pick this one: the distribution, or the plugin if that is shared
    # Runs the probe on first need (set by load_registry; None once probed, or for an entry built by hand).
    prober: Callable[[list[BackendEntry]], None] | None = field(default=None, repr=False, compare=False)

    @property
    def block_rows(self) -> int | None:
        """BackendSpec.block_rows, for the memory estimate (None: the whole batch, or no spec)."""
        return self.spec.block_rows if self.spec is not None else None

    @property
    def block_bytes(self) -> int:
        """BackendSpec.block_bytes, for the memory estimate (0: blocks of block_rows only, or no spec)."""
        return self.spec.block_bytes if self.spec is not None else 0

    def _probed(self) -> BackendEntry:
        if self.prober is not None:
            self.prober([self])
        return self

    @property
    def qualified_name(self) -> str:
        return f"{self.qualifier or self.distribution}:{self.name}"

    @property
    def selector(self) -> str:
        """What selects exactly this backend: its name, or its qualified name when the name is shared."""
        return self.qualified_name if self.ambiguous else self.name

    @property
    def ambiguous(self) -> bool:
        return bool(self.also_provided_by)

    @property
    def available(self) -> bool:
        self._probed()
        return self.error is None and self.probe is not None and self.probe.available

    @property
    def score(self) -> int:
        return self.probe.score if self.available and self.probe else 0

    @property
    def status_reason(self) -> str:
        self._probed()
        if self.error is not None:
            return f"broken: {self.error}"
        reason = self.probe.reason if self.probe else ""
        if self.ambiguous:
            clash = (f"duplicate name: also provided by {', '.join(self.also_provided_by)}; never picked by auto, "
                     f"choose with --backend {self.qualified_name}")
            return f"{clash} ({reason})" if reason else clash
        return reason

    def matches(self, requested: str) -> bool:
        """`name`, or `distribution:name` / `plugin:name` (the qualified form resolves duplicates)."""
        qualifier, _, name = requested.rpartition(":")
        if name != self.name:
            return False
        known = {normalize(self.distribution), normalize(self.plugin), normalize(self.plugin.rpartition(":")[2])}
        return not qualifier or normalize(qualifier) in known


@dataclass
class BackendRegistry:
    entries: list[BackendEntry] = field(default_factory=list)
    failures: list[PluginFailure] = field(default_factory=list)
    plugin_manager: pluggy.PluginManager | None = None

    def probe(self, entries: list[BackendEntry] | None = None) -> None:
        """Probe these entries (default: all) that are not probed yet, at once."""
        todo = [e for e in (self.entries if entries is None else entries) if e.prober is not None]
        if todo:
            todo[0].prober(todo)  # type: ignore[misc]

    def get(self, name: str) -> BackendEntry | None:
        """The backend called `name` (or `distribution:name`), probed; None if none is. Ambiguous names raise."""
        found = [e for e in self.entries if e.matches(name)]
        self.probe(found)
        if len(found) > 1:
            choices = ", ".join(e.qualified_name for e in found)
            raise BackendSelectionError(
                f"backend name '{name}' is provided by {len(found)} distributions "
                f"({', '.join(f'{e.distribution} {e.version}'.strip() for e in found)}); choose one with "
                f"--backend or $EEMICROGPT_BACKEND set to one of: {choices} (or uninstall one)"
            )
        return found[0] if found else None

    def available(self) -> list[BackendEntry]:
        self.probe()
        return [e for e in self.entries if e.available]

    def _available_names(self, precision: str | None = None) -> str:
        names = [e.name for e in self.available() if precision is None or (e.spec and e.spec.precision == precision)]
        return ", ".join(names) if names else "none"

    def auto_choice(
        self, shape: ModelShape, batch: int, dtype: str = "float32", precision: str | None = None
    ) -> BackendEntry | None:
        """The highest-scoring available backend of this precision (fp32 unless asked) that supports this
        configuration (score 0 never wins)."""
        candidates = [
            e for e in self.available()
            if e.score > 0 and not e.ambiguous and e.spec is not None and e.spec.precision == wanted(precision)
            and e.spec.unsupported_reason(shape, batch, dtype) is None
        ]
        return max(candidates, key=lambda e: (e.score, e.name), default=None)

    def fallback_note(self, chosen: BackendEntry, shape: ModelShape, batch: int, dtype: str = "float32") -> str | None:
        """One line when `auto` settled for a backend below others available here that cannot run this shape
        (e.g. numpy_ref for a width no native kernel has), naming them and why."""
        precision = chosen.spec.precision if chosen.spec is not None else None
        better = [e for e in self.available()
                  if e.score > chosen.score and e.spec is not None and e.spec.precision == precision]
        if not better:
            return None
        reasons = "; ".join(str(e.spec.unsupported_reason(shape, batch, dtype)) for e in better if e.spec)
        return f"only {chosen.name} can run {shape.describe()} here ({reasons}); expect it to be slower"

    def select(
        self, requested: str | None, shape: ModelShape, batch: int, dtype: str = "float32",
        precision: str | None = None,
    ) -> BackendEntry:
        """The backend to run: `auto` (or None) picks the best of the wanted precision; a name must also
        compute in `precision` when one is given."""
        if requested in (None, "", "auto"):
            return self._select_auto(shape, batch, dtype, precision)
        entry = self.get(requested)
        if entry is None:
            known = ", ".join(e.name for e in self.entries) or "none installed"
            failed = "; ".join(f"{f.plugin} ({f.distribution}): {f.error}" for f in self.failures)
            if failed:  # its provider may be among them: say why they did not load rather than only "unknown"
                raise BackendSelectionError(
                    f"backend '{requested}' is not provided by any plugin that loaded (available names: "
                    f"{known}); plugins that failed to load: {failed}"
                )
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
            able = [e.name for e in self.available()
                    if e.spec is not None and e.spec.unsupported_reason(shape, batch, dtype) is None]
            raise BackendSelectionError(
                f"backend '{requested}' cannot run this configuration: {reason}. "
                f"Backends here that can: {', '.join(able) if able else 'none'}"
            )
        if precision is not None and entry.spec.precision != precision:
            raise BackendSelectionError(
                f"backend '{requested}' computes in {entry.spec.precision}, not the requested precision "
                f"{precision}; {precision} backends available here: {self._available_names(precision)}"
            )
        return entry

    def _select_auto(self, shape: ModelShape, batch: int, dtype: str, precision: str | None) -> BackendEntry:
        choice = self.auto_choice(shape, batch, dtype, precision)
        if choice is not None:
            return choice
        if not self.entries:
            raise BackendSelectionError(f"no eemicrogpt backend is installed: {INSTALL_HINT}")
        reasons = []
        for e in self.entries:
            if e.spec is None:
                continue
            if e.spec.precision != wanted(precision):
                reason: str | None = f"computes in {e.spec.precision}"
            elif e.available:
                reason = e.spec.unsupported_reason(shape, batch, dtype)
            else:
                reason = e.status_reason
            reasons.append(f"{e.name}: {reason or 'never chosen automatically (score 0)'}")
        why = "; ".join(reasons)
        raise BackendSelectionError(
            f"no available backend can run {shape.describe()}, batch={batch}, "
            f"dtype={dtype}, precision={wanted(precision)} ({why})"
        )


def _disabled_names() -> set[str]:
    return {name.strip() for name in os.environ.get(DISABLE_ENV, "").split(",") if name.strip()}


_describe = plugin_guard.describe
Notify = Callable[[str], None]


def note_on_stderr(text: str) -> None:
    """Where the registry says a plugin call is slow (the CLI's stdout stays the command's output)."""
    print(f"eemicrogpt: note: {text}", file=sys.stderr, flush=True)


def _slow_notice(notify: Notify, what: list[str]) -> Callable[[list[int], float], None]:
    def on_slow(indices: list[int], limit: float) -> None:
        names = ", ".join(what[i] for i in indices)
        notify(f"waiting for {names}: slow (each call is given up after {limit:g} s, ${plugin_guard.TIMEOUT_ENV})")
    return on_slow


def _guarded_calls(calls: list[Callable[[], object]], keys: list[str | None], what: list[str],
                   notify: Notify) -> list[plugin_guard.Outcome]:
    """call_all, except that calls remembered as hung are not made again, and new hangs are remembered."""
    outcomes: list[plugin_guard.Outcome | None] = []
    limit = plugin_guard.plugin_timeout()
    for call_key in keys:
        recalled = probe_memory.recall(call_key, limit)
        outcomes.append(plugin_guard.Outcome(error=recalled, timed_out=True) if recalled else None)
    todo = [i for i, o in enumerate(outcomes) if o is None]
    fresh = plugin_guard.call_all([calls[i] for i in todo], on_slow=_slow_notice(notify, [what[i] for i in todo]))
    for i, outcome in zip(todo, fresh, strict=True):
        outcomes[i] = outcome
        if outcome.timed_out and outcome.error:
            probe_memory.remember(keys[i], outcome.error, limit)
    return [o for o in outcomes if o is not None]


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
    """Load every entry point; two distributions using the same entry-point name are both loaded."""
    disabled = _disabled_names()
    for ep in metadata.entry_points(group=hookspec.ENTRY_POINT_GROUP):
        dist_name = ep.dist.name if ep.dist else "unknown"
        dist_version = ep.dist.version if ep.dist else ""
        if ep.name in disabled or f"{dist_name}:{ep.name}" in disabled:
            continue
        plugin_name = ep.name if manager.get_plugin(ep.name) is None else f"{dist_name}:{ep.name}"
        try:
            plugin = ep.load()
        except Exception as exc:
            failures.append(PluginFailure(ep.name, dist_name, f"import failed: {_describe(exc)}"))
            continue
        error = _register(manager, plugin, plugin_name)
        if error:
            failures.append(PluginFailure(ep.name, dist_name, error))
            continue
        origin[plugin_name] = (dist_name, dist_version)


def _listed(hook: Callable[[], Any]) -> list[Any]:
    """What a plugin's hook yields or returns, as a list (None: nothing); plugin_guard checks the items."""
    return list(hook() or ())


def _collect_specs(
    manager: pluggy.PluginManager, failures: list[PluginFailure], origin: dict[str, tuple[str, str]],
    notify: Notify,
) -> list[BackendEntry]:
    """Call each plugin's hook separately (with a deadline) so that one bad plugin cannot hide the others."""
    disabled = _disabled_names()
    impls = manager.hook.eemicrogpt_backends.get_hookimpls()
    keys = [probe_memory.key(*origin.get(impl.plugin_name, (impl.plugin_name, "")),
                             f"{impl.plugin_name}: eemicrogpt_backends()") for impl in impls]
    outcomes = _guarded_calls([functools.partial(_listed, impl.function) for impl in impls], keys,
                              [f"plugin {impl.plugin_name}" for impl in impls], notify)
    entries: list[BackendEntry] = []
    for impl, outcome in zip(impls, outcomes, strict=True):
        dist, version = origin.get(impl.plugin_name, (impl.plugin_name, ""))
        plugin = impl.plugin_name
        yielded: set[str] = set()
        if outcome.error is not None:
            failures.append(PluginFailure(plugin, dist, f"eemicrogpt_backends() {outcome.error}"))
            continue
        for spec in outcome.value:
            if not isinstance(spec, BackendSpec):
                failures.append(PluginFailure(plugin, dist, f"yielded {type(spec).__name__}, not a BackendSpec"))
                continue
            bad_name = plugin_guard.name_problem(spec.name)
            if bad_name is not None:  # no row can show it: a plugin failure
                failures.append(PluginFailure(plugin, dist, bad_name))
                continue
            if spec.name in disabled or f"{dist}:{spec.name}" in disabled:
                continue
            if spec.name in yielded:
                failures.append(PluginFailure(plugin, dist, f"yielded backend '{spec.name}' twice"))
                continue
            yielded.add(spec.name)
            entry = BackendEntry(spec.name, spec, dist, version, plugin=plugin)
            problem = plugin_guard.spec_problem(spec)
            if problem is not None:
                entry.spec, entry.error = None, f"malformed BackendSpec: {problem}"
            entries.append(entry)
    _mark_duplicates(entries)
    return sorted(entries, key=lambda e: (e.name, normalize(e.distribution)))


def _mark_duplicates(entries: list[BackendEntry]) -> None:
    """Every backend whose name another distribution (or plugin) also provides lists the others."""
    by_name: dict[str, list[BackendEntry]] = {}
    for entry in entries:
        by_name.setdefault(entry.name, []).append(entry)
    for same in by_name.values():
        if len(same) < 2:
            continue
        shared_dist = len({normalize(e.distribution) for e in same}) < len(same)
        for entry in same:
            entry.qualifier = entry.plugin if shared_dist else entry.distribution
            entry.also_provided_by = [
                f"{e.distribution} {e.version}".strip() + (f" (plugin {e.plugin})" if shared_dist else "")
                for e in same if e is not entry
            ]


def _probe(entries: list[BackendEntry], notify: Notify) -> None:
    """Probe these backends at once, each with the plugin deadline: a hung probe is reported, not waited on."""
    for entry in entries:
        entry.prober = None
    todo = [e for e in entries if e.spec is not None and e.error is None]
    keys = [probe_memory.key(e.distribution, e.version, f"{e.plugin}: probe of {e.name}") for e in todo]
    outcomes = _guarded_calls([e.spec.probe for e in todo if e.spec is not None], keys,
                              [f"the probe of backend {e.name}" for e in todo], notify)
    for entry, outcome in zip(todo, outcomes, strict=True):
        if outcome.error is not None:
            entry.error = f"probe {outcome.error}"
        elif (problem := plugin_guard.probe_problem(outcome.value)) is not None:
            entry.error = problem
        else:
            entry.probe = outcome.value


def load_registry(*, entry_points: bool = True, extra_plugins: Iterable[object] = (),
                  notify: Notify = note_on_stderr) -> BackendRegistry:
    """Every plugin's backends, each probed when first needed (see the module docstring); notify hears of a
    plugin call that is slow to return."""
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
    entries = _collect_specs(manager, failures, origin, notify)

    def prober(todo: list[BackendEntry]) -> None:
        _probe(todo, notify)

    for entry in entries:
        entry.prober = prober
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


@dataclass(frozen=True)
class Peak:
    gflops: float
    source: str  # who measured it


def _call_peak_hook(registry: BackendRegistry, hook_name: str, plugin: str, args: dict[str, Any]) -> float | None:
    assert registry.plugin_manager is not None
    impls = [impl for impl in getattr(registry.plugin_manager.hook, hook_name).get_hookimpls()
             if impl.plugin_name == plugin]
    if not impls:
        return None
    impl = impls[0]
    outcome = plugin_guard.call(lambda: impl.function(*(args[a] for a in impl.argnames)))
    if outcome.error is not None or outcome.value is None or plugin_guard.peak_value_problem(outcome.value):
        return None
    return float(outcome.value)


def peak_gflops(registry: BackendRegistry, seconds: float = 0.3, precision: str = FP32) -> Peak | None:
    """This core's peak in `precision` (FP32: FMA), measured by the plugin of the best backend of that
    precision here, or None.

    Only one plugin is asked: the one providing the highest-scoring available backend of that precision (the
    backend that runs this host's ISA best, hence the one whose microbenchmark knows it). Another plugin
    implementing the hook is ignored, so installing a plugin cannot change the "% of peak" of the others; the
    answer must be a finite positive number, and the call has the plugin deadline.
    """
    if registry.plugin_manager is None:
        return None
    candidates = [e for e in registry.available() if e.score > 0 and not e.ambiguous and e.spec
                  and e.spec.precision == precision]
    best = max(candidates, key=lambda e: (e.score, e.name), default=None)
    if best is None:
        return None
    value = _call_peak_hook(registry, "eemicrogpt_peak_gflops", best.plugin,
                            {"precision": precision, "seconds": seconds})
    return None if value is None else Peak(value, f"{best.distribution} (plugin of {best.name})")
