"""The ARM build logic as a Mac or an aarch64 Linux box would run it, simulated on any host.

Nothing here can run Apple's toolchain, so the platform (sysconfig, platform.machine) is monkeypatched and
the compiler is a fake that records what it was asked and fails where a too-old compiler would.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
from setuptools import Distribution
from setuptools.errors import CompileError

HERE = Path(__file__).resolve().parent
BACKENDS = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(BACKENDS / "sme2_common"))
import arm_setup  # noqa: E402
import sme2_setup  # noqa: E402


def simulate(monkeypatch: pytest.MonkeyPatch, plat: str, machine: str) -> None:
    """Make the build see `plat` (sysconfig.get_platform()) on a CPU `machine` (platform.machine())."""
    monkeypatch.setattr(arm_setup, "target_platform", lambda: plat)
    monkeypatch.setattr(arm_setup.platform, "machine", lambda: machine)


@pytest.mark.parametrize(
    ("plat", "machine", "arm"),
    [
        ("macosx-11.0-universal2", "arm64", True),  # python.org installer on Apple silicon
        ("macosx-11.0-universal2", "x86_64", False),  # the same installer on an Intel Mac
        ("macosx-14.0-arm64", "arm64", True),  # Homebrew / conda Python
        ("macosx-10.9-x86_64", "x86_64", False),
        ("linux-aarch64", "aarch64", True),
        ("linux-aarch64", "x86_64", True),  # the lane's cross build (_PYTHON_HOST_PLATFORM)
        ("linux-x86_64", "x86_64", False),
        ("win-arm64", "ARM64", False),
    ],
)
def test_arm_target_detection(monkeypatch: pytest.MonkeyPatch, plat: str, machine: str, arm: bool) -> None:
    simulate(monkeypatch, plat, machine)
    assert arm_setup.is_arm_target() is arm


def test_universal2_python_builds_and_tags_arm64_only(monkeypatch: pytest.MonkeyPatch) -> None:
    simulate(monkeypatch, "macosx-11.0-universal2", "arm64")
    assert arm_setup.darwin_arm64_only_env() == {
        "ARCHFLAGS": "-arch arm64", "_PYTHON_HOST_PLATFORM": "macosx-11.0-arm64"
    }
    simulate(monkeypatch, "macosx-14.0-arm64", "arm64")
    assert arm_setup.darwin_arm64_only_env() == {}


def test_universal2_environment_reaches_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """ArmBuildExt.run sets ARCHFLAGS before setuptools reads the compiler configuration."""
    simulate(monkeypatch, "macosx-11.0-universal2", "arm64")
    monkeypatch.delenv("ARCHFLAGS", raising=False)
    monkeypatch.delenv("_PYTHON_HOST_PLATFORM", raising=False)
    seen: dict[str, str | None] = {}
    monkeypatch.setattr(
        arm_setup.build_ext, "run", lambda self: seen.update(ARCHFLAGS=arm_setup.os.environ.get("ARCHFLAGS"))
    )
    arm_setup.ArmBuildExt(Distribution()).run()
    assert seen["ARCHFLAGS"] == "-arch arm64"


@pytest.mark.parametrize(
    ("linker", "want"),
    [
        (["clang", "-bundle", "-undefined", "dynamic_lookup"], ["clang", "-bundle", "-undefined", "error"]),
        (["clang", "-bundle", "-Wl,-undefined,dynamic_lookup"], ["clang", "-bundle", "-Wl,-undefined,error"]),
        (["clang", "-shared"], ["clang", "-shared", "-Wl,-undefined,error"]),
    ],
)
def test_darwin_links_with_undefined_symbols_as_errors(linker: list[str], want: list[str]) -> None:
    assert arm_setup.strict_linker(linker, "darwin") == want


def test_linux_links_with_z_defs() -> None:
    assert arm_setup.strict_linker(["gcc", "-shared"], "linux") == ["gcc", "-shared", "-Wl,-z,defs"]


class FakeCompiler:
    """A compiler that refuses SME code (as Apple clang < Xcode 16.3 or gcc 12 would) or accepts all."""

    def __init__(self, knows_sme: bool, exe: str = "clang") -> None:
        self.knows_sme = knows_sme
        self.compiler_so = [exe]
        self.linker_so = [exe, "-bundle", "-undefined", "dynamic_lookup"]
        self.compiled: list[str] = []

    def compile(self, sources: list[str], output_dir: str = ".", **kwargs: object) -> list[str]:
        text = "".join(Path(s).read_text() for s in sources)
        if not self.knows_sme and "__arm_locally_streaming" in text:
            raise CompileError("error: unknown attribute '__arm_locally_streaming'")
        self.compiled += sources
        return [str(Path(output_dir) / (Path(s).stem + ".o")) for s in sources]


def build_cmd(tmp_path: Path, compiler: FakeCompiler) -> arm_setup.ArmBuildExt:
    cmd = arm_setup.ArmBuildExt(Distribution())
    cmd.build_lib, cmd.build_temp = str(tmp_path / "lib"), str(tmp_path / "temp")
    cmd.ensure_finalized()
    cmd.compiler = compiler
    return cmd


def sme2_extension(backend: str) -> arm_setup.ArmExtension:
    (ext,) = sme2_setup.sme2_setup_kwargs(**{backend: "pkg._emg_sme2"})["ext_modules"]
    return ext


@pytest.mark.parametrize(("plat", "hint"), [("macosx-14.0-arm64", "Xcode >= 16.3"), ("linux-aarch64", "clang-19")])
def test_old_compiler_leaves_a_reason_the_probe_shows(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, plat: str, hint: str
) -> None:
    simulate(monkeypatch, plat, "arm64")
    monkeypatch.delenv(arm_setup.STRICT_ENV, raising=False)
    cmd = build_cmd(tmp_path, FakeCompiler(knows_sme=False))
    cmd.build_extension(sme2_extension("sme2_f32"))
    note = tmp_path / "lib" / "pkg" / "_emg_sme2.not-built.txt"
    reason = note.read_text()
    assert reason.startswith("sme2_f32: the kernels library was not built:") and hint in reason
    if plat.startswith("macosx"):
        assert 'CC="$(brew --prefix llvm)/bin/clang"' in reason
    from eemicrogpt_core.backends.native import not_built_reason

    assert not_built_reason(note.parent, "_emg_sme2") == reason.strip()


def test_strict_build_fails_instead(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    simulate(monkeypatch, "macosx-14.0-arm64", "arm64")
    monkeypatch.setenv(arm_setup.STRICT_ENV, "1")
    cmd = build_cmd(tmp_path, FakeCompiler(knows_sme=False))
    with pytest.raises(arm_setup.BuildRefused, match=r"Xcode >= 16\.3"):
        cmd.build_extension(sme2_extension("sme2_f16"))


def test_feature_test_uses_what_the_kernels_use() -> None:
    kernels = (BACKENDS / "sme2_common" / "sme2_gemm.c").read_text()
    reads32 = ["svread_hor_za32_f32_vg4", "svread_ver_za32_f32_vg4"]
    uses = {"sme2_f32": ["svmopa_za32_f32_m", *reads32],
            "sme2_f16": ["svmopa_za16_f16_m", "svread_hor_za16_f16_vg2", "svread_ver_za16_f16_vg2"],
            "sme2_f16w": ["svmopa_za32_f16_m", "svzip1_f16", *reads32]}
    assert set(uses) == set(sme2_setup.VARIANTS)
    for backend, constructs in uses.items():
        test = sme2_setup.feature_test(sme2_setup.VARIANTS[backend])
        for construct in ["__arm_locally_streaming", '__arm_new("za")', "__arm_streaming", *constructs]:
            assert construct in test and construct in kernels, construct
        assert "#error" in test and "__ARM_FEATURE_SVE" in test  # gcc's +sme implying SVE is refused


def test_missing_objdump_warns_on_a_user_machine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(arm_setup.STRICT_ENV, raising=False)
    monkeypatch.delenv("LLVM_OBJDUMP", raising=False)
    monkeypatch.setattr(arm_setup.a64_objcheck, "find_objdump", lambda: None)
    library = tmp_path / "lib.so"
    library.write_bytes(b"")
    cmd = build_cmd(tmp_path, FakeCompiler(knows_sme=True))
    cmd._objcheck(sme2_extension("sme2_f32"), [], str(library))
    assert "llvm-objdump (LLVM >= 17) not found" in capsys.readouterr().err
    assert library.exists()
    monkeypatch.setenv(arm_setup.STRICT_ENV, "1")
    with pytest.raises(arm_setup.BuildRefused, match="not found"):
        cmd._objcheck(sme2_extension("sme2_f32"), [], str(library))


def test_not_an_arm_target_declares_no_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    simulate(monkeypatch, "linux-x86_64", "x86_64")
    assert sme2_setup.sme2_setup_kwargs(sme2_f32="pkg._emg_sme2") == {}


def test_sme2_extension_is_optional_and_keeps_sve_out(monkeypatch: pytest.MonkeyPatch) -> None:
    simulate(monkeypatch, "macosx-11.0-universal2", "arm64")
    ext = sme2_extension("sme2_f16")
    assert ext.optional
    assert "-march=armv8.7-a+sme2+sme-f16f16" in ext.extra_compile_args
    assert not any("sve" in flag or "armv9" in flag for flag in ext.extra_compile_args)
    assert all("+sme" not in flag for flags in ext.plain.values() for flag in flags)


def test_widening_fp16_build_needs_no_f16f16(monkeypatch: pytest.MonkeyPatch) -> None:
    """sme2_f16w is for SME2 CPUs without FEAT_SME_F16F16 (M4): the compiler must not be allowed F16F16."""
    simulate(monkeypatch, "linux-aarch64", "aarch64")
    ext = sme2_extension("sme2_f16w")
    assert "-march=armv8.7-a+sme2" in ext.extra_compile_args
    assert not any("f16f16" in flag for flag in ext.extra_compile_args)
    assert ("EMG_SME_F16", "1") in ext.define_macros and ("EMG_SME_F16_WIDEN", "1") in ext.define_macros


def test_neon_needs_no_fp16(monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(BACKENDS / "neon"))
    neon_setup = importlib.import_module("setup")
    try:
        assert neon_setup.compile_args("linux") == ["-std=c11", "-O3", "-march=armv8-a"]
        assert neon_setup.compile_args("darwin") == ["-std=c11", "-O3"]  # Apple clang targets Apple silicon
        simulate(monkeypatch, "macosx-11.0-universal2", "arm64")
        (ext,) = neon_setup.extensions()
        assert ext.optional and ext.objcheck.no_sme
    finally:
        sys.path.remove(str(BACKENDS / "neon"))
        sys.modules.pop("setup", None)
