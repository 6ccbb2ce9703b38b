"""a64_objcheck: SVE/SME only in streaming code, no Neon there. Rules on synthetic disassembly everywhere;
on real objects where clang-19 and llvm-objdump can cross-compile for aarch64 (the development hosts)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import a64_objcheck as oc  # noqa: E402

GEMM = HERE.parent.parent / "sme2_common" / "sme2_gemm.c"


def insns(*lines: str) -> list[oc.Insn]:
    out = []
    for i, line in enumerate(lines):
        mnemonic, _, operands = line.partition(" ")
        out.append(oc.Insn(4 * i, mnemonic, operands))
    return out


@pytest.mark.parametrize(
    "insn",
    ["cntd x9", "rdvl x0, #1", "addvl sp, sp, #-2", "whilelo p0.s, xzr, x8", "pfalse p0.b", "ptrue p1.s",
     "incw x3", "ld1w {z0.s}, p0/z, [x0]", "fmopa za0.s, p0/m, p1/m, z0.s, z1.s", "cntp x0, p0, p1.b"],
)
def test_sve_and_sme_outside_streaming_are_refused(insn: str) -> None:
    problems = oc.check_function("step", insns("stp x29, x30, [sp, #-16]!", insn, "ret"), False, False)
    assert len(problems) == 1 and "outside streaming mode" in problems[0]


def test_prologue_before_smstart_is_non_streaming() -> None:
    """A locally-streaming function: cntd in the prologue (gcc's +sme implying SVE) SIGILLs on an M4."""
    body = insns("rdsvl x9, #1", "cntd x10", "smstart sm", "cntd x11", "smstop sm", "ptrue p0.s", "ret")
    problems = oc.check_function("sme_gemm", body, False, False)
    assert [p.split(": ")[0] for p in problems] == ["sme_gemm+0x4", "sme_gemm+0x14"]


def test_sme_legal_outside_streaming_is_accepted() -> None:
    body = insns("rdsvl x9, #1", "smstart za", "zero {za}", "str za[w12, 0], [x0]", "smstop za", "ret")
    assert oc.check_function("f", body, False, False) == []
    assert oc.check_function("probe", insns("rdsvl x9, #1"), False, no_sme=True)  # not on CPUs without SME


def test_neon_inside_streaming_code_is_refused() -> None:
    """Without FEAT_SME_FA64 (Apple) Neon vector instructions are illegal in streaming mode."""
    assert oc.check_function("k", insns("fadd v0.4s, v1.4s, v2.4s"), True, False)
    assert oc.check_function("k", insns("fadd s0, s1, s2", "ldr q0, [x0]"), True, False) == []
    body = insns("smstart sm", "fadd v0.4s, v1.4s, v2.4s", "smstop sm", "fadd v0.4s, v1.4s, v2.4s")
    assert len(oc.check_function("k", body, False, False)) == 1


def test_streaming_functions_are_found_in_the_kernels() -> None:
    names = oc.streaming_functions(GEMM)
    assert "gemm_body" in names
    assert "sme_gemm" not in names  # __arm_locally_streaming: its prologue is non-streaming


def _cross(tmp_path: Path, source: str, march: str) -> Path:
    clang, objdump = shutil.which("clang-19"), oc.find_objdump()
    if clang is None or objdump is None:
        pytest.skip("needs clang-19 and llvm-objdump (the aarch64 lane's toolchain) to compile test objects")
    c = tmp_path / "t.c"
    c.write_text(source)
    obj = tmp_path / "t.o"
    done = subprocess.run([clang, "--target=aarch64-linux-gnu", "-O2", march, "-c", str(c), "-o", str(obj)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"clang-19 cannot cross-compile here: {done.stderr.strip()[:200]}")
    return obj


SME_SOURCE = """#include <arm_sme.h>
__arm_locally_streaming void fill(float *x) { svst1_f32(svptrue_b32(), x, svdup_n_f32(1.0f)); }
"""


def test_real_object_with_implied_sve_is_refused(tmp_path: Path) -> None:
    """+sve beside +sme2 (what gcc's +sme does) puts cntd before smstart: the check must catch it."""
    obj = _cross(tmp_path, SME_SOURCE, "-march=armv8.7-a+sme2+sve")
    problems = oc.check_file(obj, oc.find_objdump(), set())
    assert problems and all("outside streaming mode" in p for p in problems)


def test_real_sme2_object_passes(tmp_path: Path) -> None:
    obj = _cross(tmp_path, SME_SOURCE, "-march=armv8.7-a+sme2")
    assert oc.check_file(obj, oc.find_objdump(), set()) == []
