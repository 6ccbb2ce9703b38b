"""Per-function check of aarch64 objects: SVE/SME only where the CPU is in streaming mode, no Neon there.

Apple M4/M5 have SME but no SVE outside streaming mode and no FEAT_SME_FA64, so:
- a function that is not streaming may hold no SVE/SME instruction at all, scalar-result and predicate
  ones included (`cntd`, `rdvl`, `addvl`, `whilelo`, `ptrue`, `pfalse`, ...), except the few SME ones that
  are legal outside streaming mode (`rdsvl`, `smstart`/`smstop`, `zero {za}`, ZA spills);
- a locally-streaming function runs non-streaming until its `smstart sm` and after its `smstop sm`: its
  prologue and epilogue obey the rule above (a `cntd` there, which gcc's `+sme` implying SVE produces,
  SIGILLs on an M4);
- inside streaming code, Neon vector instructions are illegal (they need FEAT_SME_FA64).
Functions whose whole body is streaming (`__arm_streaming`) are named by the caller, usually found in the C
sources by `streaming_functions`. `--no-sme` (for code that must run on CPUs without SME, like the Neon
backend and the CPU probe) forbids every SME instruction too.

Usage: python a64_objcheck.py [--objdump PATH] [--no-sme] [--streaming NAME]... FILE...
Exits 1 and names function, address and instruction for every violation.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

OBJDUMP_NAMES = ("llvm-objdump-19", "llvm-objdump", "llvm-objdump-22", "llvm-objdump-21", "llvm-objdump-20")
# Decode every extension the kernels could contain, so nothing hides as <unknown>.
MATTR = "+sve2,+sme2,+sme-f16f16,+sme-f64f64,+sme-i16i64,+fullfp16,+bf16,+i8mm,+dotprod"

_SVE_OPERAND = re.compile(r"\b(?:z\d+|p\d+|pn\d+)(?:\.[bhsdq])?\b|\bza\d*[hv]?(?:\.[bhsdq])?\b|\{\s*za|\bza\[")
_SVE_MNEMONIC = re.compile(
    r"^(?:smstart|smstop|rdsvl|addsvl|addspl|rdvl|addvl|addpl|cnt[bhwdp]|(?:sq|uq)?(?:inc|dec)[bhwdp]"
    r"|while\w+|ptrues?|pfalse|ptest|setffr|rdffr|wrffr|cterm(?:eq|ne)|zero|fmopa|fmops|bfmopa|smopa|umopa"
    r"|sumopa|usmopa|mova|movaz|luti[24]|zeroa)$"
)
# SME instructions that are legal while PSTATE.SM is 0 (on a CPU with SME).
_SME_NON_STREAMING = re.compile(r"^(?:smstart|smstop|rdsvl|addsvl|addspl)$|^(?:zero|ldr|str)$")
_NEON_OPERAND = re.compile(r"\bv\d+\.(?:\d+)?[bhsd]\b")
_SMSTART_SM = re.compile(r"^smstart$|^smstart\s+sm$|^msr\s+svcr(?:sm|smza)\w*,\s*#1$", re.I)
_SMSTOP_SM = re.compile(r"^smstop$|^smstop\s+sm$|^msr\s+svcr(?:sm|smza)\w*,\s*#0$", re.I)
_FUNCTION = re.compile(r"^([0-9a-f]+) <(.+)>:$")
_INSN = re.compile(r"^\s*([0-9a-f]+):\s+(\S+)(?:\s+(.*?))?\s*(?://.*)?$")
# `static void f(args) __arm_streaming ...{` (not _compatible, not __arm_locally_streaming before the name).
_STREAMING_DECL = re.compile(r"\b(\w+)\s*\([^()]*\)\s*(?:__arm_\w+(?:\(\"[^\"]*\"\))?\s*)*__arm_streaming\b(?!_)")


@dataclass(frozen=True)
class Insn:
    address: int
    mnemonic: str
    operands: str

    @property
    def text(self) -> str:
        return f"{self.mnemonic} {self.operands}".strip()


def find_objdump() -> str | None:
    """An llvm-objdump new enough for SME2 (LLVM >= 17), or None."""
    for name in OBJDUMP_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def streaming_functions(*sources: Path) -> set[str]:
    """Names of functions declared `__arm_streaming` (whole body in streaming mode) in C sources."""
    names: set[str] = set()
    for source in sources:
        names.update(_STREAMING_DECL.findall(source.read_text()))
    return names


def disassemble(path: Path, objdump: str) -> dict[str, list[Insn]]:
    """Instructions of every function symbol in an object or shared library."""
    out = subprocess.run(
        [objdump, "-d", "--no-show-raw-insn", f"--mattr={MATTR}", str(path)],
        check=True, capture_output=True, text=True,
    ).stdout
    return parse_disassembly(out)


def parse_disassembly(text: str) -> dict[str, list[Insn]]:
    """`llvm-objdump -d --no-show-raw-insn` output -> instructions per function symbol."""
    functions: dict[str, list[Insn]] = {}
    current: list[Insn] | None = None
    for line in text.splitlines():
        if match := _FUNCTION.match(line):
            current = functions.setdefault(match.group(2), [])
        elif current is not None and (match := _INSN.match(line)):
            current.append(Insn(int(match.group(1), 16), match.group(2).lower(), (match.group(3) or "").lower()))
    return functions


def is_sve_or_sme(insn: Insn) -> bool:
    return bool(_SVE_MNEMONIC.match(insn.mnemonic) or _SVE_OPERAND.search(insn.operands))


def legal_outside_streaming(insn: Insn) -> bool:
    """An SME instruction that a CPU with SME (and no SVE) executes with PSTATE.SM = 0."""
    if insn.mnemonic in ("zero", "ldr", "str"):  # zero {za}, ldr/str za[...]: ZA state, not SVE
        return "za" in insn.operands and not re.search(r"\b[zp]\d+", insn.operands)
    return bool(_SME_NON_STREAMING.match(insn.mnemonic))


def check_function(name: str, insns: list[Insn], streaming: bool, no_sme: bool) -> list[str]:
    """Violations in one function; `streaming` says its whole body runs with PSTATE.SM = 1."""
    problems: list[str] = []
    in_streaming = streaming
    start = insns[0].address if insns else 0
    for insn in insns:
        text = insn.text
        where = f"{name}+{insn.address - start:#x}: {text}"
        if insn.mnemonic == "<unknown>":
            problems.append(f"{where}: undecodable instruction")
            continue
        sve = is_sve_or_sme(insn)
        if no_sme and sve:
            problems.append(f"{where}: SVE/SME instruction in code that must run without SME")
        elif _SMSTART_SM.match(text):
            in_streaming = True
        elif _SMSTOP_SM.match(text):
            in_streaming = streaming
        elif in_streaming and _NEON_OPERAND.search(insn.operands):
            problems.append(f"{where}: Neon instruction in streaming code (illegal without FEAT_SME_FA64)")
        elif not in_streaming and sve and not legal_outside_streaming(insn):
            problems.append(f"{where}: SVE/SME instruction outside streaming mode (SIGILL on Apple M4/M5)")
    return problems


def check_file(path: Path, objdump: str, streaming: set[str], no_sme: bool = False) -> list[str]:
    problems = []
    for name, insns in disassemble(path, objdump).items():
        problems += check_function(name, insns, name in streaming, no_sme)
    return [f"{path.name}: {p}" for p in problems]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--objdump", default=None, help="llvm-objdump to use (default: found on PATH)")
    parser.add_argument("--no-sme", action="store_true", help="forbid every SVE/SME instruction")
    parser.add_argument("--streaming", action="append", default=[], help="a function whose body is streaming")
    parser.add_argument("--streaming-from", action="append", default=[], type=Path,
                        help="C source whose __arm_streaming functions are streaming")
    args = parser.parse_args(argv)
    objdump = args.objdump or find_objdump()
    if objdump is None:
        print("a64_objcheck: llvm-objdump (LLVM >= 17) not found", file=sys.stderr)
        return 2
    streaming = set(args.streaming) | streaming_functions(*args.streaming_from)
    problems = [p for f in args.files for p in check_file(f, objdump, streaming, args.no_sme)]
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
