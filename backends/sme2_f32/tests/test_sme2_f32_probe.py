"""The probe, the declared shapes, `auto`'s preference and the native guard. Runs on x86 and aarch64.

The negative CPU paths replace the readers the probe asks (machine, OS, AT_HWCAP2, sysctl) with
monkeypatch; the lane also runs this file under QEMU_CPU=max,sme=off, where they are real.
"""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
from eemicrogpt_backend_sme2 import plugin, probe, spec

from eemicrogpt_core import native
from eemicrogpt_core.model import ModelShape
from eemicrogpt_core.registry import DISABLE_ENV, load_registry

ON_ARM = platform.machine().lower() in probe.ARM_MACHINES
X86_REASON = "sme2_f32: requires an aarch64 CPU with FEAT_SME2; this machine is x86_64"


def _spec():
    (found,) = plugin.eemicrogpt_backends()
    return found


@pytest.fixture
def no_native_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything loads a native library of ours (probes must not)."""

    def refuse(*args: object) -> None:
        raise AssertionError("the probe loaded a native library")

    monkeypatch.setattr(native, "load_library", refuse)
    monkeypatch.setattr(native.cffi.FFI, "dlopen", refuse)


@pytest.fixture
def arm_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "machine", lambda: "aarch64")
    monkeypatch.setattr(probe, "os_name", lambda: "linux")


def test_non_arm_machine_gets_the_documented_reason(monkeypatch: pytest.MonkeyPatch, no_native_code: None) -> None:
    monkeypatch.setattr(probe, "machine", lambda: "x86_64")
    result = _spec().probe()
    assert (result.available, result.reason, result.score) == (False, X86_REASON, 0)


@pytest.mark.usefixtures("arm_linux", "no_native_code")
def test_missing_sme2_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    # SME without SME2 (bit 23 only), as an Armv9.0 SME core would report
    monkeypatch.setattr(probe, "linux_hwcap2", lambda: 1 << 23)
    result = _spec().probe()
    assert not result.available
    assert result.reason == "sme2_f32: this aarch64 CPU does not report SME2 (HWCAP2_SME2 missing from AT_HWCAP2)"


@pytest.mark.usefixtures("arm_linux")
def test_missing_library_is_unavailable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(probe, "linux_hwcap2", lambda: probe.HWCAP2_SME2)
    built = spec.sme2_spec("sme2_f32", "test", tmp_path, plugin.LIBRARY_STEM, f16f16=False, score=60)
    result = built.probe()
    assert not result.available
    assert "was not built" in result.reason and str(tmp_path) in result.reason


@pytest.mark.parametrize(("sme2", "available"), [(1, True), (0, False)])
def test_macos_reads_the_sme2_sysctl(monkeypatch: pytest.MonkeyPatch, sme2: int, available: bool) -> None:
    asked: list[str] = []
    monkeypatch.setattr(probe, "machine", lambda: "arm64")
    monkeypatch.setattr(probe, "os_name", lambda: "darwin")
    monkeypatch.setattr(probe, "macos_sysctl_int", lambda name: asked.append(name) or sme2)
    reason = probe.unavailable_reason("sme2_f32", f16f16=False)
    assert asked == ["hw.optional.arm.FEAT_SME2"]
    assert (reason is None) == available
    if not available:
        assert "hw.optional.arm.FEAT_SME2 is 0" in reason


def test_other_operating_systems_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "machine", lambda: "aarch64")
    monkeypatch.setattr(probe, "os_name", lambda: "freebsd14")
    assert probe.unavailable_reason("sme2_f32", False) == (
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
    has_sme2 = bool(probe.linux_hwcap2() & probe.HWCAP2_SME2)
    built = native.find_library(plugin.PACKAGE_DIR, plugin.LIBRARY_STEM) is not None
    assert entry.available == (has_sme2 and built), entry.status_reason
    if not has_sme2:
        assert "HWCAP2_SME2 missing" in entry.status_reason
    else:  # the note reports the streaming vector length the kernel gives this process
        bits = 8 * probe.linux_sme_vl_bytes()
        assert bits in (128, 256, 512, 1024, 2048)
        assert f"{bits}-bit streaming vectors" in entry.status_reason


@pytest.mark.skipif(not ON_ARM, reason="the native library exists only on aarch64")
def test_library_refuses_a_cpu_without_sme2() -> None:
    """Second line of defence: emg_create itself checks AT_HWCAP2 (in a TU built without SME flags)."""
    path = native.find_library(plugin.PACKAGE_DIR, plugin.LIBRARY_STEM)
    assert path is not None, "the lane must have built _emg_sme2.so"
    shape = ModelShape(64, 4)
    if probe.linux_hwcap2() & probe.HWCAP2_SME2:
        session = native.NativeSession(str(path), shape, 4)
        assert session.get_state().params.shape == (shape.n_params,)
        session.close()
    else:
        with pytest.raises(native.NativeBackendError) as info:
            native.NativeSession(str(path), shape, 4)
        assert info.value.status == 2  # EMG_ERR_UNSUPPORTED, not a SIGILL


@pytest.mark.parametrize(
    ("d_model", "n_heads", "batch", "message"),
    [
        (64, 4, 1, None),
        (128, 8, 256, None),
        (32, 4, 16, "sme2_f32 supports d_model 64, 128, not 32"),
        (64, 2, 16, "sme2_f32 supports n_heads 4, 8, not 2"),
        (64, 4, 257, "sme2_f32 supports batch 1..256, not 257"),
    ],
)
def test_declared_shapes(d_model: int, n_heads: int, batch: int, message: str | None) -> None:
    assert _spec().unsupported_reason(ModelShape(d_model, n_heads), batch) == message


def test_auto_prefers_sme2_f32_from_d64_and_never_sme2_f16(monkeypatch: pytest.MonkeyPatch) -> None:
    """With SME2 + F16F16 reported and the libraries present, `auto` takes sme2_f32 where it can run."""
    monkeypatch.setattr(probe, "machine", lambda: "aarch64")
    monkeypatch.setattr(probe, "os_name", lambda: "linux")
    monkeypatch.setattr(probe, "linux_hwcap2", lambda: probe.HWCAP2_SME2 | probe.HWCAP2_SME_F16F16)
    monkeypatch.setattr(probe, "linux_sme_vl_bytes", lambda: 64)
    monkeypatch.setattr(spec, "find_library", lambda directory, stem: Path(directory) / f"{stem}.so")
    monkeypatch.setenv(DISABLE_ENV, "x86")  # the host's AVX backends would outrank everything here
    registry = load_registry()
    assert registry.get("sme2_f32").available and registry.get("sme2_f16").available
    assert registry.get("sme2_f32").score > (registry.get("neon").score if registry.get("neon") else 0)
    for d_model, n_heads in ((64, 4), (128, 4), (128, 8)):
        assert registry.select("auto", ModelShape(d_model, n_heads), 16).name == "sme2_f32"
    for d_model in (16, 32):
        assert registry.select("auto", ModelShape(d_model, 4), 16).name not in ("sme2_f32", "sme2_f16")
    assert registry.get("sme2_f16").score == 0


@pytest.mark.skipif(not ON_ARM, reason="needs the real neon and sme2_f32 libraries (aarch64 lane)")
def test_auto_on_this_cpu_prefers_sme2_f32_over_neon() -> None:
    registry = load_registry()
    sme2, neon = registry.get("sme2_f32"), registry.get("neon")
    if not (sme2 and sme2.available and neon and neon.available):
        pytest.skip("needs both sme2_f32 and neon available (QEMU_CPU with SME2)")
    assert registry.select("auto", ModelShape(64, 4), 16).name == "sme2_f32"
    assert registry.select("auto", ModelShape(32, 4), 16).name == "neon"

