"""The probes of sme2_f16 (FEAT_SME_F16F16 on top of SME2) and sme2_f16w (SME2 only: the widening fp16
FMOPA is base SME); `auto` picks either only when fp16 is asked for (their spec's precision is fp16).

The probe's other paths (no SME2, macOS SME2 key, other OS) are tested with sme2_f32 (the same module,
sme2_common/sme2_probe.py). The lane
also runs this file under QEMU_CPU=max,sme=off, where the CPU really lacks SME.
"""

from __future__ import annotations

import platform

import pytest
from eemicrogpt_backend_sme2_f16 import plugin, probe
from eemicrogpt_backend_sme2_f16.spec import Sme2Plugin

from eemicrogpt_core.backends import native
from eemicrogpt_core.backends.registry import load_registry
from eemicrogpt_core.model.shape import ModelShape

ON_ARM = platform.machine().lower() in probe.ARM_MACHINES


def _reason_on(
    monkeypatch: pytest.MonkeyPatch, machine: str, system: str, backend: Sme2Plugin = plugin.sme2_f16,
    **facts: int,
) -> str | None:
    """The probe verdict of `backend` on a pretend CPU: `facts` are AT_HWCAP2 (hwcap2) or sysctl keys. On a
    machine without the built library an available CPU reads as "not built"."""
    monkeypatch.setattr(probe, "machine", lambda: machine)
    monkeypatch.setattr(probe, "os_name", lambda: system)
    monkeypatch.setattr(probe, "linux_hwcap2", lambda: facts.get("hwcap2", 0))
    monkeypatch.setattr(probe, "macos_sysctl_int", lambda key: facts.get(key.rsplit(".", 1)[-1], 0))
    (found,) = backend.eemicrogpt_backends()
    result = found.probe()
    assert result.available == (result.reason.startswith("SME2")), result.reason
    return None if result.available else result.reason


def test_non_arm_machine_gets_the_documented_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _reason_on(monkeypatch, "x86_64", "linux") == (
        "sme2_f16: requires an aarch64 CPU with FEAT_SME2 and FEAT_SME_F16F16; this machine is x86_64"
    )


def test_sme2_without_f16f16_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Apple M4's case on Linux: SME2 reported, SME_F16F16 not."""
    reason = _reason_on(monkeypatch, "aarch64", "linux", hwcap2=probe.HWCAP2_SME2)
    assert reason is not None and reason.startswith("sme2_f16: ") and "HWCAP2_SME_F16F16 missing" in reason


def test_macos_without_f16f16_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    reason = _reason_on(monkeypatch, "arm64", "darwin", FEAT_SME2=1)
    assert reason is not None and "hw.optional.arm.FEAT_SME_F16F16 is 0" in reason


def test_real_probe_on_this_machine() -> None:
    entry = load_registry().get("sme2_f16")
    assert entry is not None, "eemicrogpt-backend-sme2-f16 is not installed"
    if not ON_ARM:
        assert not entry.available and "this machine is" in entry.status_reason
        return
    has_cpu = probe.reports(probe.SME2) and probe.reports(probe.SME_F16F16)
    built = native.find_library(plugin.PACKAGE_DIR, plugin.sme2_f16.backend.stem) is not None
    assert entry.available == (has_cpu and built), entry.status_reason
    if not probe.reports(probe.SME2):
        assert "FEAT_SME2, not reported" in entry.status_reason
    assert entry.spec is not None and entry.spec.precision == "fp16"  # so `auto` picks it only for precision fp16


# ---- sme2_f16w: fp16 operands, fp32 accumulation; SME2 is all it needs ----------------------------------

def test_f16w_non_arm_machine_gets_the_documented_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _reason_on(monkeypatch, "x86_64", "linux", plugin.sme2_f16w) == (
        "sme2_f16w: requires an aarch64 CPU with FEAT_SME2; this machine is x86_64"
    )


@pytest.mark.parametrize(("system", "facts"), [("linux", {"hwcap2": probe.HWCAP2_SME2}), ("darwin", {"FEAT_SME2": 1})])
def test_f16w_runs_on_sme2_without_f16f16(monkeypatch: pytest.MonkeyPatch, system: str, facts: dict[str, int]) -> None:
    """Apple M4's case: SME2 without FEAT_SME_F16F16 is enough (only the library may still be missing)."""
    reason = _reason_on(monkeypatch, "aarch64" if system == "linux" else "arm64", system, plugin.sme2_f16w, **facts)
    assert reason is None or ("not built" in reason and "FEAT_" not in reason), reason


def test_f16w_without_sme2_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    reason = _reason_on(monkeypatch, "aarch64", "linux", plugin.sme2_f16w, hwcap2=probe.HWCAP2_SME_F16F16)
    assert reason is not None and reason.startswith("sme2_f16w: requires FEAT_SME2, not reported")


def test_f16w_real_probe_on_this_machine() -> None:
    entry = load_registry().get("sme2_f16w")
    assert entry is not None, "eemicrogpt-backend-sme2-f16 does not register sme2_f16w"
    if not ON_ARM:
        assert not entry.available and "this machine is" in entry.status_reason
        return
    built = native.find_library(plugin.PACKAGE_DIR, plugin.sme2_f16w.backend.stem) is not None
    assert entry.available == (probe.reports(probe.SME2) and built), entry.status_reason
    assert entry.spec is not None and entry.spec.precision == "fp16"  # so `auto` picks it only for precision fp16


@pytest.mark.skipif(not ON_ARM, reason="the native library exists only on aarch64")
@pytest.mark.parametrize(
    ("stem", "features"),
    [(plugin.sme2_f16.backend.stem, (probe.SME2, probe.SME_F16F16)), (plugin.sme2_f16w.backend.stem, (probe.SME2,))],
    ids=["sme2_f16", "sme2_f16w"],
)
def test_library_refuses_only_a_cpu_without_its_features(stem: str, features: tuple[probe.Feature, ...]) -> None:
    path = native.find_library(plugin.PACKAGE_DIR, stem)
    assert path is not None, f"the lane must have built {stem}.so"
    if all(probe.reports(feature) for feature in features):
        native.NativeSession(str(path), ModelShape(64, 4), 4).close()
    else:
        with pytest.raises(native.NativeBackendError) as info:
            native.NativeSession(str(path), ModelShape(64, 4), 4)
        assert info.value.status == native.STATUS["EMG_ERR_UNSUPPORTED"]  # not a SIGILL
