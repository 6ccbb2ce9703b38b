"""The probe, the declared shapes, `auto`'s preference and the native guard. Runs on x86 and aarch64.

The negative CPU paths replace the readers the probe asks (machine, OS, AT_HWCAP2, sysctl) with
monkeypatch; the lane also runs this file under QEMU_CPU=max,sme=off, where they are real.
"""

from __future__ import annotations

import importlib
import platform
from pathlib import Path
from types import ModuleType

import pytest
from eemicrogpt_backend_sme2 import plugin, probe, spec

from eemicrogpt_core.backends import native
from eemicrogpt_core.backends.registry import DISABLE_ENV, load_registry
from eemicrogpt_core.model.shape import ModelShape

ON_ARM = platform.machine().lower() in probe.ARM_MACHINES
X86_REASON = "sme2_f32: requires an aarch64 CPU with FEAT_SME2; this machine is x86_64"


def _probe_result():
    (found,) = plugin.sme2_f32.eemicrogpt_backends()
    return found.probe()


class FakeCpu:
    """Replaces what the probe reads from the OS, and makes loading any native library an error."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch

        def no_native(*args: object) -> None:
            raise AssertionError("a probe must not load native code")

        monkeypatch.setattr(native, "load_library", no_native)
        monkeypatch.setattr(native.cffi.FFI, "dlopen", no_native)

    def set(self, machine: str, system: str = "linux", hwcap2: int = 0) -> None:
        self.monkeypatch.setattr(probe, "machine", lambda: machine)
        self.monkeypatch.setattr(probe, "os_name", lambda: system)
        self.monkeypatch.setattr(probe, "linux_hwcap2", lambda: hwcap2)


@pytest.fixture
def cpu(monkeypatch: pytest.MonkeyPatch) -> FakeCpu:
    return FakeCpu(monkeypatch)


def test_non_arm_machine_gets_the_documented_reason(cpu: FakeCpu) -> None:
    cpu.set("x86_64")
    result = _probe_result()
    assert (result.available, result.reason, result.score) == (False, X86_REASON, 0)


def test_missing_sme2_is_unavailable(cpu: FakeCpu) -> None:
    cpu.set("aarch64", hwcap2=1 << 23)  # SME without SME2, as an Armv9.0 SME core reports
    result = _probe_result()
    assert not result.available
    assert result.reason == (
        "sme2_f32: requires FEAT_SME2, not reported (this aarch64 CPU: HWCAP2_SME2 missing from AT_HWCAP2)"
    )


def test_missing_library_is_unavailable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(probe, "unavailable_reason", lambda name, f16f16: None)  # CPU fine, library absent
    built = spec.sme2_spec("sme2_f32", "test", tmp_path, plugin.sme2_f32.backend.stem, f16f16=False, score=60)
    result = built.probe()
    assert not result.available
    assert "was not built" in result.reason and str(tmp_path) in result.reason


@pytest.mark.parametrize(("keys", "reason"), [
    ({"hw.optional.arm.FEAT_SME2": 1}, None),
    ({}, "sme2_f32: requires FEAT_SME2, not reported (this Mac: sysctl hw.optional.arm.FEAT_SME2 is 0)"),
])
def test_macos_reads_the_sme2_sysctl(
    cpu: FakeCpu, monkeypatch: pytest.MonkeyPatch, keys: dict[str, int], reason: str | None
) -> None:
    cpu.set("arm64", system="darwin")
    monkeypatch.setattr(probe, "macos_sysctl_int", lambda name: keys.get(name, 0))  # absent key = 0
    assert probe.unavailable_reason("sme2_f32", f16f16=False) == reason


def test_other_operating_systems_are_refused(cpu: FakeCpu) -> None:
    cpu.set("aarch64", system="freebsd14", hwcap2=probe.HWCAP2_SME2)
    assert _probe_result().reason == (
        "sme2_f32: CPU feature detection is implemented for Linux and macOS only, not freebsd14"
    )


def test_real_probe_on_this_machine() -> None:
    entry = load_registry().get("sme2_f32")
    assert entry is not None, "eemicrogpt-backend-sme2 is not installed"
    if not ON_ARM:
        assert not entry.available
        want = f"sme2_f32: requires an aarch64 CPU with FEAT_SME2; this machine is {probe.machine()}"
        assert entry.status_reason == want
        return
    has_sme2 = probe.reports(probe.SME2)
    built = native.find_library(plugin.PACKAGE_DIR, plugin.sme2_f32.backend.stem) is not None
    assert entry.available == (has_sme2 and built), entry.status_reason
    if not has_sme2:
        assert "FEAT_SME2, not reported" in entry.status_reason
    else:  # the note reports the streaming vector length the OS gives this process
        bits = probe.streaming_vector_bits()
        assert bits in (128, 256, 512, 1024, 2048)
        assert f"{bits}-bit streaming vectors" in entry.status_reason


@pytest.mark.skipif(not ON_ARM, reason="the native library exists only on aarch64")
def test_library_refuses_a_cpu_without_sme2() -> None:
    """Second line of defence: emg_create itself checks AT_HWCAP2 (in a TU built without SME flags)."""
    path = native.find_library(plugin.PACKAGE_DIR, plugin.sme2_f32.backend.stem)
    assert path is not None, "the lane must have built _emg_sme2.so"
    shape = ModelShape(64, 4)
    if probe.reports(probe.SME2):
        session = native.NativeSession(str(path), shape, 4)
        assert session.get_state().params.shape == (shape.n_params,)
        session.close()
    else:
        with pytest.raises(native.NativeBackendError) as info:
            native.NativeSession(str(path), shape, 4)
        assert info.value.status == native.STATUS["EMG_ERR_UNSUPPORTED"]  # not a SIGILL


def _envelope(shape: ModelShape) -> bool:
    """supports() in sme2_common/sme2_step.c (test_sme2_f32_abi.py checks the library against it)."""
    return shape.d_model >= 64 and shape.d_model % 16 == 0


def _fake_library(monkeypatch: pytest.MonkeyPatch, *specs: ModuleType) -> None:
    """Stand-ins for the built library and its emg_supports (the envelope), so this runs on any host; `specs`
    are the spec modules to fake (default: this package's)."""
    for module in specs or (spec,):
        monkeypatch.setattr(module, "find_library", lambda directory, stem: Path(directory) / f"{stem}.so")
        monkeypatch.setattr(module, "library_load_error", lambda path: None)  # the pretend library "loads"
    monkeypatch.setattr(native, "supports", lambda path, shape: _envelope(shape))


@pytest.mark.parametrize(
    ("shape", "batch", "message"),
    [
        (ModelShape(64, 4), 1, None),
        (ModelShape(128, 8), 256, None),
        (ModelShape(80, 20, 8, 256, 64), 16, None),
        (ModelShape(256, 1, 2, 2, 1), 16, None),
        (ModelShape(1024, 16, 12, 256, 256), 2, None),
        (ModelShape(32, 4), 16, "sme2_f32 has no kernel for d32, 4 heads, 1 layer, vocab 27, context 16"),
        (ModelShape(72, 4, 2), 16, "sme2_f32 has no kernel for d72, 4 heads, 2 layers, vocab 27, context 16"),
        (ModelShape(64, 4), 257, "sme2_f32 supports batch 1..256, not 257"),
    ],
    ids=["d64", "d128h8", "d80h20L8", "d256h1", "d1024L12C256", "d32", "d72", "batch257"],
)
def test_spec_asks_the_library_for_shapes(
    monkeypatch: pytest.MonkeyPatch, shape: ModelShape, batch: int, message: str | None
) -> None:
    _fake_library(monkeypatch)
    (found,) = plugin.sme2_f32.eemicrogpt_backends()
    assert found.unsupported_reason(shape, batch) == message
    assert "64-1024" in found.envelope and "context 1-256, 1-12 layers" in found.envelope


def test_auto_prefers_sme2_f32_from_d64_and_fp16_only_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """With SME2 + F16F16 reported and the libraries present, `auto` takes sme2_f32 where it can run."""
    # eemicrogpt-backend-sme2-f16 ships its own copy of the probe and spec modules: fake both packages'.
    f16_spec = importlib.import_module("eemicrogpt_backend_sme2_f16.spec")
    for module in (probe, f16_spec.probe):
        monkeypatch.setattr(module, "unavailable_reason", lambda name, f16f16: None)
        monkeypatch.setattr(module, "streaming_vector_bits", lambda: 512)
    _fake_library(monkeypatch, spec, f16_spec)
    monkeypatch.setenv(DISABLE_ENV, "x86")  # the host's AVX backends would outrank everything here
    registry = load_registry()
    assert registry.get("sme2_f32").available and registry.get("sme2_f16").available
    assert registry.get("sme2_f32").score > (registry.get("neon").score if registry.get("neon") else 0)
    for shape in (ModelShape(64, 4), ModelShape(128, 4), ModelShape(128, 8), ModelShape(96, 6, 4, 64, 32)):
        assert registry.select("auto", shape, 16).name == "sme2_f32"
    for shape in (ModelShape(16, 4), ModelShape(32, 4), ModelShape(48, 4, 2, 64, 32)):
        assert registry.select("auto", shape, 16).name not in ("sme2_f32", "sme2_f16", "sme2_f16w")
    # fp16 only on request: the best fp16 backend (sme2_f16w: fp32 accumulation, base SME) for precision fp16
    assert registry.select("auto", ModelShape(64, 4), 16, precision="fp16").name == "sme2_f16w"


@pytest.mark.skipif(not ON_ARM, reason="needs the real neon and sme2_f32 libraries (aarch64 lane)")
def test_auto_on_this_cpu_prefers_sme2_f32_over_neon() -> None:
    registry = load_registry()
    sme2, neon = registry.get("sme2_f32"), registry.get("neon")
    if not (sme2 and sme2.available and neon and neon.available):
        pytest.skip("needs both sme2_f32 and neon available (QEMU_CPU with SME2)")
    assert registry.select("auto", ModelShape(64, 4), 16).name == "sme2_f32"
    assert registry.select("auto", ModelShape(32, 4), 16).name == "neon"



@pytest.mark.parametrize("f16f16", [False, True])
def test_library_that_does_not_load_is_unavailable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, f16f16: bool
) -> None:
    """A library missing a runtime routine fails at dlopen: the probe must say so, not report available."""
    monkeypatch.setattr(probe, "unavailable_reason", lambda backend, f16f16: None)
    monkeypatch.setattr(probe, "streaming_vector_bits", lambda: 512)
    broken = tmp_path / "_emg_sme2.so"
    broken.write_bytes(b"not an ELF file")
    result = spec.sme2_spec("sme2_x", "test", tmp_path, "_emg_sme2", f16f16, score=5).probe()
    assert not result.available
    assert result.reason.startswith("sme2_x: _emg_sme2.so does not load:")


def test_build_failure_reason_is_the_probe_reason(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(probe, "unavailable_reason", lambda backend, f16f16: None)
    why = "sme2_x: the kernels library was not built: use clang >= 19"
    (tmp_path / "_emg_sme2.not-built.txt").write_text(why + "\n")
    result = spec.sme2_spec("sme2_x", "test", tmp_path, "_emg_sme2", False, score=5).probe()
    assert not result.available and result.reason == why
