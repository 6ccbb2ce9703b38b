"""The CPU probe: masking features by environment variable, non-x86 machines, missing builds, and what
the registry picks from it."""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from eemicrogpt_backend_x86 import libs, plugin
from eemicrogpt_backend_x86.probe import DISABLE_ENV, disabled_features, probe

from eemicrogpt_core.backends.native import ABI_VERSION, load_library
from eemicrogpt_core.backends.registry import load_registry
from eemicrogpt_core.model.shape import ModelShape

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86_64 only")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DISABLE_ENV, raising=False)
    monkeypatch.delenv(libs.LIB_DIR_ENV, raising=False)


def _host_has(name: str) -> None:
    result = probe(name)
    if not result.available:
        pytest.skip(f"this CPU cannot run {name}: {result.reason}")


def test_masking_the_variant_name_explains_which_features(monkeypatch: pytest.MonkeyPatch) -> None:
    _host_has("avx512")
    monkeypatch.setenv(DISABLE_ENV, "avx512")
    result = probe("avx512")
    assert not result.available and result.score == 0
    assert result.reason == (
        f"avx512: CPU lacks AVX512F, AVX512VL, AVX512BW, AVX512DQ (masked by {DISABLE_ENV})"
    )
    assert probe("avx2").available


def test_masking_one_feature_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _host_has("avx512")
    monkeypatch.setenv(DISABLE_ENV, "avx512bw")
    assert probe("avx512").reason == f"avx512: CPU lacks AVX512BW (masked by {DISABLE_ENV})"


def test_masking_avx2_takes_both_variants(monkeypatch: pytest.MonkeyPatch) -> None:
    _host_has("avx2")
    monkeypatch.setenv(DISABLE_ENV, "AVX2")
    for name in ("avx512", "avx2"):
        result = probe(name)
        assert not result.available
        assert result.reason.startswith(f"{name}: CPU lacks AVX2")


def test_unknown_mask_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"EEMICROGPT_X86_DISABLE: unknown feature 'sse9'; known: avx512"):
        disabled_features("avx2, sse9")
    assert disabled_features("avx512,FMA") == {"AVX512F", "AVX512VL", "AVX512BW", "AVX512DQ", "FMA"}


def test_non_x86_machine_gets_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert probe("avx512").reason == "avx512: requires an x86_64 CPU; this machine is aarch64"
    assert not probe("avx2").available


def test_missing_build_gets_a_reason(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv(libs.LIB_DIR_ENV, str(tmp_path))
    result = probe("avx2")
    assert not result.available
    assert "native library was not built" in result.reason
    factory = next(s for s in plugin.eemicrogpt_backends() if s.name == "avx2").factory
    with pytest.raises(RuntimeError, match="_emg_avx2 was not built"):
        factory(ModelShape(16), 4, "float32")


def test_a_library_of_another_abi_version_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """A library built for ABI version 2 (here: one that says so) next to a working probe: the backend is
    unavailable, and loading it directly fails, each with one line naming both versions."""
    _host_has("avx2")
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler to build a version-2 library")
    source = tmp_path / "old.c"
    source.write_text("int emg_abi_version(void) { return 2; }\n")
    old = tmp_path / "_emg_avx2.so"
    subprocess.run([compiler, "-shared", "-fPIC", str(source), "-o", str(old)], check=True)
    probe_lib = libs.library_path("probe")
    assert probe_lib is not None
    shutil.copy(probe_lib, tmp_path / probe_lib.name)
    monkeypatch.setenv(libs.LIB_DIR_ENV, str(tmp_path))
    needs = f"was built for native ABI version 2; this eemicrogpt needs version {ABI_VERSION}"
    result = probe("avx2")
    assert not result.available and needs in result.reason and "\n" not in result.reason
    with pytest.raises(RuntimeError, match=needs) as refused:
        load_library(str(old))
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("name", ["avx512", "avx2", "avx512_bf16", "amx_bf16"])
def test_specs_ask_the_library_for_shapes(name: str) -> None:
    _host_has(name)
    specs = {s.name: s for s in plugin.eemicrogpt_backends()}
    assert {name: spec.precision for name, spec in specs.items()} == {
        "avx512": "fp32", "avx2": "fp32", "avx512_bf16": "bf16", "amx_bf16": "bf16"}
    for spec in (specs[name],):
        assert spec.d_models is None and spec.n_heads is None and spec.max_batch == 256
        unsupported = ModelShape(24, 6)  # a width that is not a multiple of 16
        assert spec.unsupported_reason(unsupported, 16) == f"{name} has no kernel for {unsupported.describe()}"
        assert spec.unsupported_reason(ModelShape(128, 8), 256) is None
        assert spec.unsupported_reason(ModelShape(96, 3, 4, 200, 64), 256) is None
        assert spec.envelope.startswith("d_model 16-1024")
        assert spec.unsupported_reason(ModelShape(16, 4), 257) is not None
        for v3 in (ModelShape(64, 4, 12, 27, 16), ModelShape(64, 4, 1, 27, 256), ModelShape(1024, 8)):  # ABI 3 only
            assert spec.unsupported_reason(v3, 16) is None


def test_registry_auto_prefers_avx512_then_avx2(monkeypatch: pytest.MonkeyPatch) -> None:
    _host_has("avx512")
    shape = ModelShape(64, 4)
    choice = load_registry().auto_choice(shape, 16)
    assert choice is not None and choice.name == "avx512"
    monkeypatch.setenv(DISABLE_ENV, "avx512")
    registry = load_registry()
    assert registry.auto_choice(shape, 16).name == "avx2"
    entry = registry.get("avx512")
    assert entry is not None and not entry.available
    assert "CPU lacks AVX512F" in entry.status_reason


def test_bf16_is_picked_by_auto_only_when_asked_and_masks_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    _host_has("avx512_bf16")
    registry = load_registry()
    entry = registry.get("avx512_bf16")
    assert entry is not None and entry.available and entry.spec is not None and entry.spec.precision == "bf16"
    bf16_first = "amx_bf16" if probe("amx_bf16").available else "avx512_bf16"
    for d in (16, 32, 64, 128):
        assert registry.auto_choice(ModelShape(d, 4), 16).name == "avx512"
        assert registry.auto_choice(ModelShape(d, 4), 16, precision="bf16").name == bf16_first
    monkeypatch.setenv(DISABLE_ENV, "amx_bf16")
    assert probe("amx_bf16").reason == "amx_bf16: CPU lacks AMX_BF16 (masked by EEMICROGPT_X86_DISABLE)"
    assert load_registry().auto_choice(ModelShape(64, 4), 16, precision="bf16").name == "avx512_bf16"
    monkeypatch.setenv(DISABLE_ENV, "avx512_bf16")
    assert probe("avx512_bf16").reason == "avx512_bf16: CPU lacks AVX512BF16 (masked by EEMICROGPT_X86_DISABLE)"
    assert probe("avx512").available


def test_specs_declare_the_block_rows_of_the_c_session() -> None:
    """The memory estimate counts one block per thread by plugin.BLOCK_ROWS and BLOCK_BYTES; they must be
    csrc/session.h's."""
    header = (Path(__file__).resolve().parents[1] / "csrc" / "session.h").read_text()
    rows = re.search(r"^#define BLOCK_ROWS (\d+)", header, re.M)
    assert rows is not None and int(rows.group(1)) == plugin.BLOCK_ROWS
    wide = re.search(r"^#define WIDE_BLOCK_BYTES \((\d+)L << (\d+)\)", header, re.M)
    assert wide is not None and int(wide.group(1)) << int(wide.group(2)) == plugin.BLOCK_BYTES
    specs = list(plugin.eemicrogpt_backends())
    assert {(spec.block_rows, spec.block_bytes) for spec in specs} == {(plugin.BLOCK_ROWS, plugin.BLOCK_BYTES)}
