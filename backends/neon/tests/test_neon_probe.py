"""The probe, the declared shapes and selection by name. Runs on x86 (neon unavailable for real) and aarch64.

QEMU cannot take Advanced SIMD away from an aarch64 CPU, so the negative paths replace the readers the
probe asks (machine, OS, AT_HWCAP, sysctl) with monkeypatch.
"""

from __future__ import annotations

import platform
import re
from pathlib import Path

import pytest
from eemicrogpt_backend_neon import plugin, probe

from eemicrogpt_core.backends import native
from eemicrogpt_core.backends.backend import BackendSpec
from eemicrogpt_core.backends.registry import load_registry
from eemicrogpt_core.base.errors import BackendSelectionError
from eemicrogpt_core.interface.cli import app
from eemicrogpt_core.model.shape import ModelShape

ON_ARM = platform.machine().lower() in probe.ARM_MACHINES
X86_REASON = "neon: requires an aarch64 CPU with Advanced SIMD; this machine is x86_64"
ALL_HWCAPS = probe.HWCAP_ASIMD | 1 << 9 | 1 << 10  # with FPHP and ASIMDHP, which neon does not need


def _spec() -> BackendSpec:
    (spec,) = plugin.eemicrogpt_backends()
    return spec


@pytest.fixture
def no_native_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything tries to load a native library (probes must not)."""

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
    assert not result.available
    assert result.reason == X86_REASON


@pytest.mark.usefixtures("arm_linux", "no_native_code")
def test_missing_asimd_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "linux_hwcap", lambda: ALL_HWCAPS & ~probe.HWCAP_ASIMD)
    result = _spec().probe()
    assert not result.available
    assert "HWCAP_ASIMD missing" in result.reason


@pytest.mark.usefixtures("arm_linux")
def test_armv8_0_without_fp16_is_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cortex-A72 (Raspberry Pi 4, Graviton 1) reports Advanced SIMD but no FP16: the kernels need none."""
    monkeypatch.setattr(probe, "linux_hwcap", lambda: probe.HWCAP_ASIMD)
    assert probe.unavailable_reason() is None


@pytest.mark.usefixtures("arm_linux")
def test_missing_library_is_unavailable(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(probe, "linux_hwcap", lambda: ALL_HWCAPS)
    monkeypatch.setattr(plugin, "PACKAGE_DIR", tmp_path)
    result = _spec().probe()
    assert not result.available
    assert "was not built" in result.reason and str(tmp_path) in result.reason


@pytest.mark.parametrize(("advsimd", "available"), [(1, True), (0, False)])
def test_macos_reads_the_advsimd_sysctl(monkeypatch: pytest.MonkeyPatch, advsimd: int, available: bool) -> None:
    asked: list[str] = []
    monkeypatch.setattr(probe, "machine", lambda: "arm64")
    monkeypatch.setattr(probe, "os_name", lambda: "darwin")
    monkeypatch.setattr(probe, "macos_sysctl_int", lambda name: asked.append(name) or advsimd)
    reason = probe.unavailable_reason()
    assert asked == ["hw.optional.AdvSIMD"]
    assert (reason is None) == available
    if not available:
        assert "hw.optional.AdvSIMD is 0" in reason


def test_other_operating_systems_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "machine", lambda: "aarch64")
    monkeypatch.setattr(probe, "os_name", lambda: "freebsd14")
    reason = probe.unavailable_reason()
    assert reason == "neon: CPU feature detection is implemented for Linux and macOS only, not freebsd14"


def test_real_probe_on_this_machine() -> None:
    entry = load_registry().get("neon")
    assert entry is not None, "eemicrogpt-backend-neon is not installed"
    if not ON_ARM:
        assert not entry.available
        want = f"neon: requires an aarch64 CPU with Advanced SIMD; this machine is {platform.machine().lower()}"
        assert entry.status_reason == want
        return
    if probe.os_name() == "darwin":  # getauxval is Linux-only
        has_cpu = bool(probe.macos_sysctl_int("hw.optional.AdvSIMD"))
    else:
        has_cpu = bool(probe.linux_hwcap() & probe.HWCAP_ASIMD)
    assert entry.available == (has_cpu and plugin.library_path() is not None), entry.status_reason


@pytest.mark.parametrize(
    ("d_model", "n_heads", "batch", "message"),
    [
        (16, 4, 1, None),
        (128, 8, 256, None),
        (80, 16, 16, "neon has no kernel for d80, 16 heads, 1 layer, vocab 27, context 16"),
        (16, 4, 257, "neon supports batch 1..256, not 257"),
        (16, 4, 0, "neon supports batch 1..256, not 0"),
    ],
)
def test_spec_asks_the_library_for_shapes(
    monkeypatch: pytest.MonkeyPatch, d_model: int, n_heads: int, batch: int, message: str | None
) -> None:
    """The spec declares no shapes: it asks emg_supports (a stand-in here, so this runs on any host)."""
    asked = []
    monkeypatch.setattr(plugin, "library_path", lambda: Path("/lib/_neon_kernels.so"))
    def fake_supports(path: str, shape: ModelShape) -> bool:
        asked.append(path)
        return shape.head_dim % 4 == 0  # the library's rule (csrc/abi.c)

    monkeypatch.setattr(native, "supports", fake_supports)
    assert _spec().unsupported_reason(ModelShape(d_model, n_heads), batch) == message
    assert asked == ["/lib/_neon_kernels.so"]


def test_selecting_unavailable_neon_names_the_reason_and_the_alternatives(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "machine", lambda: "x86_64")
    registry = load_registry()
    with pytest.raises(BackendSelectionError) as info:
        registry.select("neon", ModelShape(16, 4), 16)
    message = str(info.value)
    assert X86_REASON in message
    assert "Available here: " in message and "numpy_ref" in message.split("Available here: ")[1]


def test_cli_train_with_unavailable_neon_fails_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path
) -> None:
    monkeypatch.setattr(probe, "machine", lambda: "x86_64")
    names = tmp_path / "names.txt"
    names.write_text("emma\nolivia\nava\nisabella\nsophia\nmia\namelia\nharper\n" * 4)
    args = ["train", "--backend", "neon", "--d-model", "16", "--steps", "1", "--data", str(names)]
    code = app([*args, "--out", str(tmp_path / "run")], standalone_mode=False)
    err = capsys.readouterr().err
    assert code == 2
    assert X86_REASON in err and "numpy_ref" in err


@pytest.mark.usefixtures("arm_linux")
def test_library_that_does_not_load_is_unavailable(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(probe, "linux_hwcap", lambda: probe.HWCAP_ASIMD)
    broken = tmp_path / "_neon_kernels.so"
    broken.write_bytes(b"not an ELF file")
    monkeypatch.setattr(plugin, "PACKAGE_DIR", tmp_path)
    result = _spec().probe()
    assert not result.available
    assert result.reason.startswith("neon: _neon_kernels.so does not load:")


def test_block_rows_is_the_librarys() -> None:
    """The memory estimate counts one block per thread by plugin.BLOCK_ROWS; it must be csrc/session.h's."""
    header = Path(__file__).resolve().parents[1] / "csrc" / "session.h"
    rows = re.search(r"^#define NEON_BLOCK_ROWS (\d+)", header.read_text(), re.M)
    assert rows is not None and int(rows.group(1)) == plugin.BLOCK_ROWS == _spec().block_rows
