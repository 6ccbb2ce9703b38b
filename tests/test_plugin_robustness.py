"""Plugins cannot take the CLI down or take over another's name or the benchmark's peak.

Hung or crashing probes and hooks, specs of the wrong types, duplicate backend names (in-process and from
two installed distributions, whatever the hook order), the peak GFLOP/s, and one failing backend in bench.
"""

from __future__ import annotations

import json
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eemicrogpt_core.backends.backend import BackendSpec, ProbeResult
from eemicrogpt_core.backends.hookspec import hookimpl
from eemicrogpt_core.backends.plugin_guard import TIMEOUT_ENV
from eemicrogpt_core.backends.registry import load_registry, peak_gflops
from eemicrogpt_core.base.errors import BackendSelectionError
from eemicrogpt_core.data.names import encode, read_names
from eemicrogpt_core.interface import cli
from eemicrogpt_core.model.shape import DEFAULT_CONTEXT, ModelShape
from eemicrogpt_core.model.vocab import Vocabulary
from eemicrogpt_core.tools import bench

SHAPE = ModelShape(16, 4)
NEVER = threading.Event()  # never set: a probe waiting on it hangs for good


def _numpy_factory():
    from eemicrogpt_backend_numpy.session import NumpySession

    return NumpySession


def _spec(name: str, score: int = 10, probe=None, **fields) -> BackendSpec:
    return BackendSpec(name, f"{name} test backend", probe or (lambda: ProbeResult.ok(score)),
                       lambda s, b, d: _numpy_factory()(s, b, d), **fields)


def _plugin(name: str, *specs: BackendSpec, peak=None, **marks) -> types.ModuleType:
    module = types.ModuleType(name)
    module.eemicrogpt_backends = hookimpl(**marks)(lambda: list(specs))
    if peak is not None:
        module.eemicrogpt_peak_gflops = hookimpl(**marks)(lambda precision, seconds: peak())
    return module


def _registry(*plugins):
    return load_registry(entry_points=False, extra_plugins=plugins)


# ---- hung, crashing and malformed plugins -------------------------------------------------------------------
def test_hung_probe_is_reported_not_waited_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TIMEOUT_ENV, "0.3")
    t0 = time.perf_counter()
    reg = _registry(_plugin("p", _spec("stuck", probe=lambda: NEVER.wait()), _spec("fine")))
    assert time.perf_counter() - t0 < 3.0
    assert "did not return within 0.3 s" in reg.get("stuck").status_reason
    assert [e.name for e in reg.available()] == ["fine"]
    with pytest.raises(BackendSelectionError, match="stuck' is unavailable: broken: probe did not return"):
        reg.select("stuck", SHAPE, 16)


def test_hung_hook_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TIMEOUT_ENV, "0.3")
    hung = types.ModuleType("hung")
    hung.eemicrogpt_backends = hookimpl(lambda: NEVER.wait())
    reg = _registry(hung, _plugin("p", _spec("fine")))
    assert [e.name for e in reg.available()] == ["fine"]
    assert "did not return within 0.3 s" in next(f.error for f in reg.failures if f.plugin == "hung")


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt(), MemoryError("probe ate it all")])
def test_probe_raising_anything_only_breaks_its_own_row(exc: BaseException) -> None:
    def probe():
        raise exc

    reg = _registry(_plugin("p", _spec("crashy", probe=probe), _spec("fine")))
    assert reg.get("crashy").status_reason.startswith(f"broken: probe raised {type(exc).__name__}")
    assert reg.auto_choice(SHAPE, 16).name == "fine"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"d_models": 16}, "d_models must be None or a tuple of positive ints, got 16"),
        ({"n_heads": (4, "8")}, "n_heads must be None or a tuple of positive ints"),
        ({"max_batch": "256"}, "max_batch must be a positive int, got '256'"),
        ({"dtypes": "float32"}, "dtypes must be a tuple of str"),
        ({"probe": None}, "probe is NoneType, not callable"),
        ({"factory": 3}, "factory is int, not callable"),
        ({"description": None}, "description is NoneType, not str"),
    ],
)
def test_spec_with_wrong_types_gets_a_row_saying_what_is_wrong(fields: dict, message: str) -> None:
    good = _spec("fine")
    bad = BackendSpec(**{**{f: getattr(good, f) for f in ("probe", "factory", "description")},
                         "name": "odd", **fields})
    reg = _registry(_plugin("p", bad, good))
    entry = reg.get("odd")
    assert entry is not None and not entry.available
    assert message in entry.status_reason and "malformed BackendSpec" in entry.status_reason
    assert reg.auto_choice(SHAPE, 16).name == "fine"
    report = cli.backends_report(reg)  # what `eemicrogpt backends` prints: must not raise
    json.dumps(report)
    assert any(b["name"] == "odd" and message in b["reason"] for b in report["backends"])


@pytest.mark.parametrize("name", [42, "", "auto", "x86:avx512", "has space"])
def test_spec_without_a_usable_name_is_a_plugin_failure(name: object) -> None:
    reg = _registry(_plugin("p", BackendSpec(name, "d", lambda: ProbeResult.ok(1), lambda s, b, d: None)))
    assert reg.entries == []
    assert "is not a name" in reg.failures[0].error


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ("yes", "probe returned str, not a ProbeResult"),
        (ProbeResult(True, "", "high"), "probe score is str, not int"),
        (ProbeResult(True, "", True), "probe score is bool, not int"),
        (ProbeResult(True, 42, 1), "probe reason is int, not str"),
        (ProbeResult(1, "", 1), "probe available is int, not bool"),
    ],
)
def test_probe_returning_the_wrong_type_is_broken(result: object, message: str) -> None:
    reg = _registry(_plugin("p", _spec("odd", probe=lambda: result)))
    assert message in reg.get("odd").status_reason and not reg.available()


def test_cli_backends_survives_every_kind_of_broken_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TIMEOUT_ENV, "0.3")
    plugins = (_plugin("p", _spec("stuck", probe=lambda: NEVER.wait()), _spec("fine"),
                       BackendSpec("odd", "d", lambda: ProbeResult.ok(1), None, d_models=16)),)
    monkeypatch.setattr(cli, "load_registry", lambda: _registry(*plugins))
    result = CliRunner().invoke(cli.app, ["backends", "--json"])
    assert result.exit_code == 0, result.output
    rows = {b["name"]: b for b in json.loads(result.stdout)["backends"]}
    assert rows["fine"]["available"] and "did not return" in rows["stuck"]["reason"]
    assert "factory is NoneType" in rows["odd"]["reason"]


# ---- duplicate names ----------------------------------------------------------------------------------------
def test_duplicate_name_lists_both_and_auto_picks_neither() -> None:
    reg = _registry(_plugin("one", _spec("same", score=5)), _plugin("two", _spec("same", score=50)),
                    _plugin("three", _spec("other", score=1)))
    same = [e for e in reg.entries if e.name == "same"]
    assert len(same) == 2 and all(e.ambiguous and e.available for e in same)
    assert "duplicate name: also provided by" in same[0].status_reason
    assert reg.auto_choice(SHAPE, 16).name == "other"
    with pytest.raises(BackendSelectionError, match=r"'same' is provided by 2 distributions.*one:same.*two:same"):
        reg.select("same", SHAPE, 16)
    assert reg.select("two:same", SHAPE, 16).plugin == "two"
    assert reg.select("one:same", SHAPE, 16).plugin == "one"


def _fake_distribution(root: Path, name: str, module: str, entry_point: str, body: str) -> None:
    (root / f"{module}.py").write_text(textwrap.dedent(body))
    info = root / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[eemicrogpt.backends]\n{entry_point} = {module}\n")


PLUGIN_BODY = """
    from eemicrogpt_core.backends.backend import BackendSpec, ProbeResult
    from eemicrogpt_core.backends.hookspec import hookimpl

    @hookimpl({marks})
    def eemicrogpt_backends():
        yield BackendSpec("fastest", "{who}", lambda: ProbeResult.ok({score}), lambda s, b, d: None)

    @hookimpl({marks})
    def eemicrogpt_peak_gflops(precision, seconds):
        return {peak}
"""


@pytest.mark.parametrize("marks", ["trylast=True", "tryfirst=True", ""])
def test_an_installed_plugin_cannot_take_over_a_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     marks: str) -> None:
    # The impostor uses the same entry-point name, sorts first on the path and sets hook-order marks.
    _fake_distribution(tmp_path, "aaa-impostor", "impostor_plug", "x86fake",
                       PLUGIN_BODY.format(marks=marks, who="impostor", score=1, peak=0.5))
    _fake_distribution(tmp_path, "genuine-backend", "genuine_plug", "x86fake",
                       PLUGIN_BODY.format(marks="", who="genuine", score=100, peak=200.0))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        reg = load_registry()
        rows = [e for e in reg.entries if e.name == "fastest"]
        assert sorted(e.distribution for e in rows) == ["aaa-impostor", "genuine-backend"]
        assert all(e.available and e.error is None for e in rows)  # neither is reported broken
        with pytest.raises(BackendSelectionError, match=r"aaa-impostor 1\.0, genuine-backend 1\.0"):
            reg.select("fastest", SHAPE, 16)
        assert reg.select("genuine-backend:fastest", SHAPE, 16).spec.description == "genuine"
        assert reg.select("aaa_impostor:fastest", SHAPE, 16).spec.description == "impostor"
        assert peak_gflops(reg) is None or peak_gflops(reg).gflops != 0.5
    finally:
        for module in ("impostor_plug", "genuine_plug"):
            sys.modules.pop(module, None)


# ---- the peak GFLOP/s ---------------------------------------------------------------------------------------
def test_peak_comes_only_from_the_plugin_of_the_best_backend() -> None:
    best = _plugin("best", _spec("fast", score=100), peak=lambda: 180.0)
    rogue = _plugin("rogue", _spec("slow", score=2), peak=lambda: 2.7, tryfirst=True)
    for order in ((best, rogue), (rogue, best)):
        peak = peak_gflops(_registry(*order))
        assert peak is not None and peak.gflops == 180.0 and "plugin of fast" in peak.source


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -3.0, 0, "fast", True])
def test_a_nonsense_peak_is_ignored(value: object) -> None:
    assert peak_gflops(_registry(_plugin("best", _spec("fast", score=100), peak=lambda: value))) is None


def test_a_hung_peak_measurement_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TIMEOUT_ENV, "0.3")
    assert peak_gflops(_registry(_plugin("best", _spec("fast", score=100), peak=lambda: NEVER.wait()))) is None


def test_each_precision_has_the_peak_of_its_own_best_backend() -> None:
    both = _plugin("both", _spec("wide", score=50), _spec("narrow", score=40, precision="bf16"))
    both.eemicrogpt_peak_gflops = hookimpl()(lambda precision, seconds: {"fp32": 90.0, "bf16": 360.0}[precision])
    other = _plugin("other", _spec("older", score=100), peak=lambda: 75.0)
    reg = _registry(both, other)
    bf16 = peak_gflops(reg, precision="bf16")
    assert bf16 is not None and bf16.gflops == 360.0 and "plugin of narrow" in bf16.source
    fp32 = peak_gflops(reg)  # the best fp32 backend is other's
    assert fp32 is not None and fp32.gflops == 75.0 and "plugin of older" in fp32.source
    assert peak_gflops(_registry(both)).gflops == 90.0
    assert peak_gflops(reg, precision="fp16") is None  # no fp16 backend


def test_no_peak_without_a_scoring_backend() -> None:
    assert peak_gflops(_registry(_plugin("p", _spec("manual", score=0), peak=lambda: 50.0))) is None


# ---- bench keeps going --------------------------------------------------------------------------------------
NAMES = ["emma", "olivia", "ava", "isabella", "sophia", "mia", "charlotte", "amelia", "harper", "evelyn"] * 30


@pytest.fixture
def names_file(tmp_path: Path) -> Path:
    path = tmp_path / "names.txt"
    path.write_text("\n".join(NAMES) + "\n")
    return path


def test_one_failing_backend_does_not_abort_bench(names_file: Path) -> None:
    def broken_factory(shape, max_batch, dtype):
        raise RuntimeError("kernel table missing")

    plugin = _plugin("p", BackendSpec("broken", "d", lambda: ProbeResult.ok(1), broken_factory))
    reg = load_registry(extra_plugins=(plugin,))
    data, _ = encode(read_names(names_file).names, Vocabulary.names(), DEFAULT_CONTEXT)
    cells = bench.speed_cells([reg.get("broken"), reg.get("numpy_ref")], [ModelShape(16)])
    rows, _ = bench.measure(cells, data, repeats=2, target_s=0.02)
    by_backend = {r.backend: r for r in rows}
    assert "kernel table missing" in by_backend["broken"].error
    assert by_backend["numpy_ref"].error is None and by_backend["numpy_ref"].us_per_step > 0
    assert bench.as_json(speed=rows)["speed"][0]["us_per_step"] is None  # NaN never reaches the JSON


def test_bench_cli_shows_the_failed_row_and_exits_1(names_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from eemicrogpt_backend_numpy.session import NumpySession

    class Exploding(NumpySession):
        def train_steps(self, tokens, lengths, lrs):
            raise FloatingPointError("boom in the kernel")

    plugin = _plugin("p", BackendSpec("exploding", "d", lambda: ProbeResult.ok(1), Exploding))
    monkeypatch.setattr(cli, "load_registry", lambda: load_registry(extra_plugins=(plugin,)))
    result = CliRunner().invoke(cli.app, ["bench", "--d-model", "16", "--seconds", "0.02", "--repeats", "1",
                                          "--data", str(names_file), "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    rows = {r["backend"]: r for r in report["speed"]}
    assert "boom in the kernel" in rows["exploding"]["error"]
    assert rows["numpy_ref"]["error"] is None and rows["numpy_ref"]["us_per_step"] > 0


def test_loss_at_keeps_going_past_a_size_that_fails(names_file: Path) -> None:
    from eemicrogpt_backend_numpy.session import NumpySession

    from eemicrogpt_core.data.names import split
    from eemicrogpt_core.training.trainer import PreparedData

    class FailsAtD32(NumpySession):
        def train_steps(self, tokens, lengths, lrs):
            if self.shape.d_model == 32:
                raise FloatingPointError("non-finite loss at step 3")
            return super().train_steps(tokens, lengths, lrs)

    reg = _registry(_plugin("one", BackendSpec("picky", "d", lambda: ProbeResult.ok(1), FailsAtD32)),
                    _plugin("two", BackendSpec("picky", "d", lambda: ProbeResult.ok(1), FailsAtD32)))
    entry = reg.get("one:picky")
    assert entry.selector == "one:picky"  # the name is shared: training selects it qualified
    vocab = Vocabulary.names()
    parts = split(encode(read_names(names_file).names, vocab, DEFAULT_CONTEXT)[0], 0.1, 0)
    rows = bench.loss_at(reg, entry, (32, 16), PreparedData(parts.train, parts.validation, 0, 0, vocab),
                         str(names_file), 0.05)
    assert "non-finite loss at step 3" in rows[0].error
    assert rows[1].error is None and rows[1].steps > 0


# ---- --version --------------------------------------------------------------------------------------------
def test_version_lists_the_core_and_every_backend_distribution() -> None:
    from eemicrogpt_core import __version__

    result = CliRunner().invoke(cli.app, ["--version"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"eemicrogpt {__version__}"
    assert any(line.split()[:2] == ["eemicrogpt-backend-numpy", __version__] for line in lines[1:])
    assert "error" not in result.output
