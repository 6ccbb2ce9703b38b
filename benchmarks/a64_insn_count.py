"""Executed aarch64 instructions per training step of the ARM backends, under QEMU in Apple's profile.

Emulated wall time means nothing; executed instructions are a speed proxy we can measure on x86. For each
backend and size, a small C driver (a64_insn_driver.c, no Python in the process) runs training steps on the
library built through its setup.py (the aarch64 lane's build stage), and QEMU logs one line per executed
instruction inside the library's, libc's and libm's text (`QEMU_LOG=exec,nochain QEMU_ONE_INSN_PER_TB=1
QEMU_DFILTER=...`, piped from QEMU's stderr into awk, never stored). Two runs, with S1 and S2 steps, are subtracted per
instruction address, so session set-up cancels out: what is left is exactly (S2 - S1) steps. Each address
is then mapped to its function and instruction with llvm-objdump-19 and counted by
- phase (by function): streaming kernels (SME: `__arm_streaming` functions, the locally-streaming entry
  points, the SME ABI runtime), forward, backward, forward+backward (neon's fused `loss_grad`), weight
  operand refresh, Adam, step glue (`emg_train_steps`, where sme2 inlines Adam), libc/libm (expf, memcpy,
  ...), other;
- kind: SME/SVE (streaming), Neon/FP (v/q/d/s/h registers), loads/stores (integer and FP/SIMD, not SVE),
  scalar (integer, branches).

Needs the aarch64 lane's cache (run `bash tools/a64lane/run.sh` once; $A64_LANE_DIR as for the lane).
Usage (from the repository root):
  python benchmarks/a64_insn_count.py                      # neon, sme2_f32, sme2_f16 at d64 and d128
  python benchmarks/a64_insn_count.py --backends sme2_f32 --d-models 64 --functions
Prints a Markdown table (the README's) and, with --functions, the per-function breakdown.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "backends" / "arm_common"))
import a64_objcheck as objcheck  # noqa: E402

APPLE_PROFILE = "max,sve=off,sme_fa64=off,sme512=on"
SHARED_OBJECT_REGION = "0x7ff000000000+0x10000000000"  # QEMU user mode maps libraries just below 0x800000000000
BACKENDS = {  # name -> (lane build dir, package dir, n_heads per d_model)
    "neon": ("neon", "eemicrogpt_backend_neon"),
    "sme2_f32": ("sme2_f32", "eemicrogpt_backend_sme2"),
    "sme2_f16": ("sme2_f16", "eemicrogpt_backend_sme2_f16"),
}
KINDS = ("SME/SVE", "Neon/FP", "ld/st", "scalar")
PHASES = ("streaming kernels", "forward", "backward", "forward+backward", "weight operands", "Adam",
          "step glue", "libc/libm", "other")
_PHASE_BY_NAME = [
    (re.compile(r"^__arm_|^sme_gemm"), "streaming kernels"),
    (re.compile(r"^forward"), "forward"),
    (re.compile(r"^backward"), "backward"),
    (re.compile(r"^loss_grad"), "forward+backward"),
    (re.compile(r"^refresh_weight_operands|^sync_transposed"), "weight operands"),
    (re.compile(r"adam", re.I), "Adam"),
    (re.compile(r"^emg_train_steps"), "step glue"),
]
_FP_SIMD_REG = re.compile(r"\b(?:v\d+|q\d+|d\d+|s\d+|h\d+|b\d+)\b")


@dataclass
class Lane:
    dir: Path
    qemu: Path
    sysroot: Path
    build_py: Path

    @classmethod
    def find(cls) -> Lane:
        root = Path(os.environ.get("A64_LANE_DIR", REPO / ".a64lane"))
        lane = cls(root, root / "qemu/usr/bin/qemu-aarch64", root / "sysroot", root / "buildenv/bin/python")
        for need in (lane.qemu, lane.sysroot, lane.build_py):
            if not need.exists():
                sys.exit(f"a64_insn_count: {need} missing: run `bash tools/a64lane/run.sh` once "
                         f"(A64_LANE_DIR={root})")
        return lane


def kind(insn: objcheck.Insn) -> str:
    if objcheck.is_sve_or_sme(insn):
        return "SME/SVE"
    if insn.mnemonic.startswith(("ld", "st", "prfm")):
        return "ld/st"
    if _FP_SIMD_REG.search(insn.operands):
        return "Neon/FP"
    return "scalar"


def phase(function: str, streaming: set[str]) -> str:
    if function in streaming:
        return "streaming kernels"
    for pattern, name in _PHASE_BY_NAME:
        if pattern.search(function):
            return name
    return "other"


def build_libraries(lane: Lane, out: Path) -> None:
    """The libraries exactly as the lane builds them: through each setup.py, cross-compiled."""
    env = {**os.environ, "SITE": str(out), "A64_LANE_DIR": str(lane.dir)}
    subprocess.run(["bash", str(REPO / "tools/a64lane/build.sh")], check=True, env=env, stdout=subprocess.DEVNULL)


def build_driver(out: Path) -> Path:
    driver = out / "a64_insn_driver"
    subprocess.run(["clang-19", "--target=aarch64-linux-gnu", "-fuse-ld=lld", "-O2", "-Wall", "-Wextra", "-Werror",
                    f"-I{REPO / 'eemicrogpt_core/include'}", str(REPO / "benchmarks/a64_insn_driver.c"),
                    "-ldl", "-o", str(driver)], check=True)
    return driver


def run_driver(lane: Lane, cpu: str, argv: list[str], dfilter: str, log_dir: Path) -> tuple[str, Counter]:
    """Run the driver under QEMU (host ASLR off, so addresses repeat between runs); count logged PCs.

    QEMU writes its log to stderr (no QEMU_LOG_FILENAME), piped straight into awk: nothing is stored."""
    env = {**os.environ, "QEMU_CPU": cpu, "QEMU_LD_PREFIX": str(lane.sysroot), "QEMU_LOG": "exec,nochain",
           "QEMU_ONE_INSN_PER_TB": "1", "QEMU_DFILTER": dfilter}
    env.pop("QEMU_LOG_FILENAME", None)
    # One line per executed instruction: "Trace 0: 0x<host> [<flags>/<guest pc>/...] <symbol>".
    program = '/^Trace/ {c[$2]++; next} {print > "/dev/stderr"} END {for (k in c) print k, c[k]}'
    with tempfile.TemporaryFile("w+", dir=log_dir) as out:
        qemu = subprocess.Popen(["setarch", "-R", str(lane.qemu), *argv], env=env, stdout=out,
                                stderr=subprocess.PIPE)
        awk = subprocess.run(["awk", "-F/", program], stdin=qemu.stderr, capture_output=True, text=True)
        qemu.stderr.close()
        status = qemu.wait()
        out.seek(0)
        stdout = out.read()
    if status or awk.returncode:
        sys.exit(f"a64_insn_count: driver failed ({status}): {awk.stderr.strip()[-2000:]}")
    counts: Counter = Counter()
    for line in awk.stdout.splitlines():
        pc, n = line.split()
        counts[int(pc, 16)] += int(n)
    return stdout, counts


@dataclass
class Mapped:
    base: int
    text: list[tuple[int, int]]


def mappings(stdout: str) -> dict[str, Mapped]:
    out: dict[str, Mapped] = {}
    for line in stdout.splitlines():
        parts = line.split()
        if parts[:1] == ["base"]:
            out.setdefault(parts[1], Mapped(0, [])).base = int(parts[2], 16)
        elif parts[:1] == ["text"]:
            out.setdefault(parts[1], Mapped(0, [])).text.append((int(parts[2], 16), int(parts[3], 16)))
    return out


def address_map(path: Path) -> dict[int, tuple[str, objcheck.Insn]]:
    """ELF virtual address -> (function, instruction) for every instruction llvm-objdump decodes."""
    objdump = objcheck.find_objdump()
    if objdump is None:
        sys.exit("a64_insn_count: llvm-objdump-19 not found (apt install llvm-19)")
    return {insn.address: (name, insn) for name, insns in objcheck.disassemble(path, objdump).items()
            for insn in insns}


def count(lane: Lane, cpu: str, driver: Path, library: Path, d_model: int, n_heads: int, batch: int,
          steps: tuple[int, int], work: Path, streaming: set[str]) -> tuple[float, dict, Counter]:
    argv = [str(driver), str(library), str(d_model), str(n_heads), str(batch)]
    # One fixed filter over the whole region where the loader maps shared objects: a filter built from the
    # reported mappings would itself move libc and libm (QEMU's set-up depends on it). Counts are keyed by
    # (file, ELF address) with each run's own load bases; PCs outside the three files (ld.so) are dropped.
    runs = []
    for n in steps:
        out, counts = run_driver(lane, cpu, [*argv, str(n)], SHARED_OBJECT_REGION, work)
        maps = mappings(out)
        located: Counter = Counter()
        for pc, c in counts.items():
            path = next((p for p, m in maps.items() if any(lo <= pc < hi for lo, hi in m.text)), None)
            if path is not None:
                located[(path, pc - maps[path].base)] += c
        runs.append(located)
    per_step = {key: (runs[1][key] - runs[0].get(key, 0)) / (steps[1] - steps[0]) for key in runs[1]}
    table: dict[tuple[str, str], float] = defaultdict(float)
    functions: Counter = Counter()
    decoded = {path: address_map(Path(path)) for path in maps}
    for (path, address), n in per_step.items():
        if not n:
            continue
        function, insn = decoded[path].get(address, ("?", None))
        is_lib = Path(path).resolve() == library.resolve()
        ph = phase(function, streaming) if is_lib else "libc/libm"
        table[(ph, kind(insn) if insn else "scalar")] += n
        functions[f"{Path(path).name.split('.')[0]}:{function}"] += n
    return sum(per_step.values()), table, functions


def fmt(n: float) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n / 1e3:.0f}k"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", default="neon,sme2_f32,sme2_f16")
    parser.add_argument("--d-models", default="64,128")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--cpu", default=APPLE_PROFILE, help=f"QEMU_CPU (default Apple M4/M5: {APPLE_PROFILE})")
    parser.add_argument("--steps", default="1,3", help="the two step counts subtracted (S1,S2)")
    parser.add_argument("--functions", action="store_true", help="also print the per-function breakdown")
    parser.add_argument("--site", type=Path, help="use libraries already built there (a lane site dir)")
    args = parser.parse_args()
    lane = Lane.find()
    steps = tuple(int(s) for s in args.steps.split(","))
    streaming = objcheck.streaming_functions(REPO / "backends/sme2_common/sme2_gemm.c")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        site = args.site or work / "site"
        if args.site is None:
            build_libraries(lane, site)
        driver = build_driver(work)
        for name in args.backends.split(","):
            _, package = BACKENDS[name]
            (library,) = (site / package).glob("*.so")
            for d in map(int, args.d_models.split(",")):
                total, table, functions = count(lane, args.cpu, driver, library, d, 4, args.batch, steps, work,
                                                streaming)
                rows.append((name, d, total, table))
                if args.functions:
                    print(f"\n{name} d{d}: per function, per step")
                    for function, n in functions.most_common(25):
                        print(f"  {fmt(n):>8}  {function}")
    print(f"\nInstructions per training step (batch {args.batch}, 4 heads, QEMU_CPU={args.cpu}):\n")
    print("| backend | d | total | " + " | ".join(PHASES) + " | " + " | ".join(KINDS) + " |")
    print("|" + " --- |" * (3 + len(PHASES) + len(KINDS)))
    for name, d, total, table in rows:
        by_phase = [sum(v for (p, _), v in table.items() if p == ph) for ph in PHASES]
        by_kind = [sum(v for (_, k), v in table.items() if k == kd) for kd in KINDS]
        cells = [fmt(v) if v else "-" for v in (*by_phase, *by_kind)]
        print(f"| {name} | {d} | {fmt(total)} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
