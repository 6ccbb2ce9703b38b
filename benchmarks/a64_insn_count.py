"""Executed aarch64 instructions per training step of the ARM backends, under QEMU in Apple's profile.

Emulated wall time means nothing; executed instructions are a speed proxy we can measure on x86. For each
backend and size, a small C driver (a64_insn_driver.c, no Python in the process) runs training steps on the
library built through its setup.py (the aarch64 lane's build stage) under QEMU with
`QEMU_LOG=in_asm,exec,nochain` and a `QEMU_DFILTER` over the shared objects' region:
- `in_asm` lists each translated block's guest instructions once, when QEMU translates it;
- `exec` with `nochain` logs one `Trace` line per executed block (no block jumps straight into the next);
- a block runs from its first instruction to its last (it ends at every branch, and nothing in a training
  step faults), so every instruction of a block executes once per `Trace` line.
QEMU's log (its stderr, never stored) is piped into awk, which counts executions per block and call stack (the
call sites still to return, from the blocks that end in `bl`/`blr` and `ret`); Python expands them to
executions per instruction. Two runs, with S1 and S2 steps, are subtracted per instruction and call stack, so
set-up cancels out: what is left is exactly (S2 - S1) steps. `--check` repeats every run with one instruction
per block (`QEMU_ONE_INSN_PER_TB=1`, one `Trace` per instruction: the first method, ~5x slower) and requires
identical counts.

Each address is mapped to its function and instruction with llvm-objdump-19 and to its DWARF inline chain
with llvm-symbolizer-19 (the lane builds with -g, which does not change clang's code). Phases (columns sum to
the total): an instruction belongs to the outermost function with a role among its call sites, outermost
first, and then its own inline chain: forward (`forward`, `seq_forward`, `pack_forward`), backward
(`backward`, `seq_backward`, `pack_backward`), weight operands (`refresh_weight_operands`, `sync_transposed`:
derived weight copies re-synced after Adam), Adam (`adam`, `emg_adam_update`, `adam_update`); none: other
(step loop, batch packing, finiteness checks). So
the GEMMs, helpers and libc/libm code that forward calls count as forward, even when inlined or shared.
Streaming kernels (the part of each phase in parentheses; "glue" is the rest, libc/libm included) are the
`__arm_streaming` functions of sme2_gemm.c, the `sme_gemm*` locally-streaming entry points and the SME ABI
runtime (`__arm_*`). Kinds (also summing to the total): SME/SVE (streaming), Neon/FP (v/q/d/s/h/b register
operands, scalar FP included), loads/stores (integer and FP/SIMD, not SVE), scalar (integer, branches).
The script checks that phases, kinds and functions each add up to the total.

Needs the aarch64 lane's cache (run `bash tools/a64lane/run.sh` once; $A64_LANE_DIR as for the lane).
Shapes: each d_model of --d-models at each vocab:context:n_layers of --shapes (default the seed's 27:16:1
and 64:32:2), 4 heads. The driver's batches are name-like: random symbols between boundary tokens, row
lengths spread over a quarter to three quarters of the context (2..10 letters at context 16).

Usage (from the repository root; prints progress on stderr and the README's Markdown table on stdout):
  python benchmarks/a64_insn_count.py                      # every built backend at d64 and d128
  python benchmarks/a64_insn_count.py --backends sme2_f32 --d-models 64 --shapes 27:16:1 --functions --check
  A64_LANE_ONLY=neon python benchmarks/a64_insn_count.py --backends neon   # build only neon (lib.sh)
  python benchmarks/a64_insn_count.py --smoke [--site DIR]  # neon at d16: proves the script runs
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "backends" / "arm_common"))
import a64_objcheck as objcheck  # noqa: E402

APPLE_PROFILE = "max,sve=off,sme_fa64=off,sme512=on"
SHARED_OBJECT_REGION = "0x7ff000000000+0x10000000000"  # QEMU user mode maps libraries just below 0x800000000000
N_HEADS = 4
# Backend name -> (package dir in the lane's site, library file stem); sme2_f16w exists on branches that build
# the widening fp16 variant (same package as sme2_f16).
BACKENDS = {
    "neon": ("eemicrogpt_backend_neon", "_neon_kernels"),
    "sme2_f32": ("eemicrogpt_backend_sme2", "_emg_sme2"),
    "sme2_f16": ("eemicrogpt_backend_sme2_f16", "_emg_sme2_f16"),
    "sme2_f16w": ("eemicrogpt_backend_sme2_f16", "_emg_sme2_f16w"),
}
DEFAULT_BACKENDS = ("neon", "sme2_f32", "sme2_f16")
DEFAULT_SHAPES = "27:16:1,64:32:2"  # vocab:context:n_layers: the seed's names model, and a larger one
SMOKE: dict[str, object] = {"backends": "neon", "d_models": "16", "shapes": "27:16:1", "batch": 2}  # --smoke
OTHER = "other"
PHASES = ("forward", "backward", "weight operands", "Adam", OTHER)
KINDS = ("SME/SVE", "Neon/FP", "ld/st", "scalar")
_STREAMING_SYMBOL = re.compile(r"^__arm_|^sme_gemm")
_ROLE_OF_FUNCTION = [  # matched against call sites and inline chains, outermost first
    (re.compile(r"^(?:seq_|pack_)?forward$"), "forward"),
    (re.compile(r"^(?:seq_|pack_)?backward$"), "backward"),
    (re.compile(r"^refresh_weight_operands$|^sync_transposed$"), "weight operands"),
    (re.compile(r"^adam$|^(?:emg_)?adam_update$"), "Adam"),
]
_FP_SIMD_REG = re.compile(r"\b(?:v\d+|q\d+|d\d+|s\d+|h\d+|b\d+)\b")

# QEMU's log -> "<executions>|<call sites>|<pc> <pc> ..." per translated block and call stack. A block's listing
# (`IN:` and its instruction lines "0x<pc>:  <hex>  <mnemonic> ...") is logged when it is translated, right before
# its first `Trace` line; `Trace 0: <host address of the block> [...]` is logged per execution. The call stack
# (the PCs of the calls, `bl`/`blr`, still to return) is kept from each executed block's last instruction: it is
# pushed after a block ending in a call and popped after one ending in `ret`. Other lines (the driver's errors)
# go to stderr.
TB_COUNTER_AWK = r"""
/^Trace / {
  if (listing != "") { block[$3] = ++n; pcs[n] = listing; ends[n] = end_kind; last[n] = last_pc; listing = "" }
  b = block[$3]
  runs[stack "|" b]++
  if (ends[b] == "call") { saved[++depth] = stack; stack = stack " " last[b] }
  else if (ends[b] == "ret" && depth > 0) stack = saved[depth--]
  next
}
/^IN:/ { listing = ""; next }
/^0x[0-9a-fA-F]+:/ {
  last_pc = substr($1, 1, length($1) - 1); listing = listing " " last_pc
  end_kind = $3 ~ /^blr?(aa|ab|aaz|abz)?$/ ? "call" : $3 ~ /^ret(aa|ab)?$/ ? "ret" : ""
  next
}
/^-+$/ || /^$/ { next }
{ print > "/dev/stderr" }
END { for (k in runs) { split(k, part, "|"); print runs[k] "|" part[1] "|" pcs[part[2]] } }
"""


class CountError(RuntimeError):
    """The log or the two runs do not give an exact per-step count."""


@dataclass
class Lane:
    dir: Path
    qemu: Path
    sysroot: Path
    build_py: Path

    @classmethod
    def locate(cls) -> Lane:
        """Where the lane's cache is ($A64_LANE_DIR, as for the lane), whether or not it is there."""
        root = Path(os.environ.get("A64_LANE_DIR", REPO / ".a64lane"))
        return cls(root, root / "qemu/usr/bin/qemu-aarch64", root / "sysroot", root / "buildenv/bin/python")

    def missing(self) -> str | None:
        """Why this cache cannot count instructions, or None when it can."""
        need = next((p for p in (self.qemu, self.sysroot, self.build_py) if not p.exists()), None)
        if need is None:
            return None
        return f"{need} missing: run `bash tools/a64lane/run.sh` once (A64_LANE_DIR={self.dir})"

    @classmethod
    def find(cls) -> Lane:
        lane = cls.locate()
        if problem := lane.missing():
            sys.exit(f"a64_insn_count: {problem}")
        return lane


# --- parsing the log and the driver's output ------------------------------------------------------------------

def expand_blocks(awk_output: str) -> Counter:
    """awk's lines -> executions per (call sites outermost first, guest instruction address)."""
    counts: Counter = Counter()
    for line in awk_output.splitlines():
        runs, stack, pcs = line.split("|")
        if not pcs.split():
            raise CountError("a translated block ran without its in_asm listing (is QEMU's log complete?)")
        calls = tuple(int(pc, 16) for pc in stack.split())
        for pc in pcs.split():
            counts[(calls, int(pc, 16))] += int(runs)
    return counts


@dataclass
class Mapped:
    base: int = 0
    text: list[tuple[int, int]] = field(default_factory=list)


def mappings(stdout: str) -> dict[str, Mapped]:
    """The driver's `base <file> <addr>` / `text <file> <lo> <hi>` lines (its /proc/self/maps)."""
    out: dict[str, Mapped] = {}
    for line in stdout.splitlines():
        parts = line.split()
        if parts[:1] == ["base"]:
            out.setdefault(parts[1], Mapped()).base = int(parts[2], 16)
        elif parts[:1] == ["text"]:
            out.setdefault(parts[1], Mapped()).text.append((int(parts[2], 16), int(parts[3], 16)))
    return out


def locate(counts: Counter, maps: dict[str, Mapped]) -> Counter:
    """Run-time PCs -> (file, ELF virtual address), for instructions and call sites: keys become
    (call sites, file, address). PCs outside the mapped files (ld.so, the driver) are dropped."""
    ranges = sorted((lo, hi, path) for path, m in maps.items() for lo, hi in m.text)
    starts = [lo for lo, _, _ in ranges]

    def where(pc: int) -> tuple[str, int] | None:
        i = bisect.bisect_right(starts, pc) - 1
        if i >= 0 and pc < ranges[i][1]:
            path = ranges[i][2]
            return path, pc - maps[path].base
        return None

    located: Counter = Counter()
    for (calls, pc), n in counts.items():
        if (at := where(pc)) is not None:
            located[(tuple(c for c in map(where, calls) if c is not None), *at)] += n
    return located


def per_step(short: Counter, long: Counter, steps: tuple[int, int]) -> dict[tuple, float]:
    """Executions per step: (long run - short run) / (S2 - S1), per key (call sites, file, address): set-up
    cancels out."""
    out = {}
    for key in short.keys() | long.keys():
        diff = long[key] - short[key]
        if diff < 0:
            raise CountError(f"{Path(key[-2]).name}+{key[-1]:#x} ran more often in the {steps[0]}-step run than in "
                             f"the {steps[1]}-step run: the runs differ outside the steps (load addresses, set-up)")
        if diff:
            out[key] = diff / (steps[1] - steps[0])
    return out


def parse_inline_chains(symbolizer_json: str) -> dict[int, list[str]]:
    """`llvm-symbolizer --inlines --output-style=JSON` lines -> address: function names, outermost first."""
    chains = {}
    for line in symbolizer_json.splitlines():
        if line.strip():
            entry = json.loads(line)
            names = [frame["FunctionName"] for frame in entry.get("Symbol", []) if frame.get("FunctionName")]
            chains[int(entry["Address"], 16)] = names[::-1]
    return chains


# --- classification ---------------------------------------------------------------------------------------

def kind(insn: objcheck.Insn | None) -> str:
    if insn is None:
        return "scalar"
    if objcheck.is_sve_or_sme(insn):
        return "SME/SVE"
    if insn.mnemonic.startswith(("ld", "st", "prfm")):
        return "ld/st"
    if _FP_SIMD_REG.search(insn.operands):
        return "Neon/FP"
    return "scalar"


def is_streaming(symbol: str, streaming: set[str]) -> bool:
    return symbol in streaming or bool(_STREAMING_SYMBOL.search(symbol))


def role(chain: list[str]) -> str | None:
    """The phase named by the outermost function of an inline chain that has one (forward, backward, ...)."""
    for function in chain:
        for pattern, name in _ROLE_OF_FUNCTION:
            if pattern.search(function):
                return name
    return None


@dataclass(frozen=True)
class Shape:
    """The model shape of one count (N_HEADS heads)."""
    d_model: int
    vocab: int
    context: int
    n_layers: int

    @property
    def label(self) -> str:
        return f"d{self.d_model} V{self.vocab} C{self.context} L{self.n_layers}"

    def driver_args(self) -> list[str]:
        return [str(v) for v in (self.d_model, N_HEADS, self.n_layers, self.vocab, self.context)]


@dataclass
class Cell:
    """One backend at one shape, per step: instructions by phase (and the streaming kernels' part of each
    phase), by kind, and by function."""
    backend: str
    shape: Shape
    phases: Counter = field(default_factory=Counter)
    streaming: Counter = field(default_factory=Counter)
    kinds: Counter = field(default_factory=Counter)
    functions: Counter = field(default_factory=Counter)
    nested: float = 0  # instructions whose own role differs from their callers' (none expected)

    @property
    def total(self) -> float:
        return sum(self.kinds.values())

    @property
    def glue(self) -> float:
        return self.total - sum(self.streaming.values())

    def check(self) -> None:
        """Phases, kinds and functions are partitions of the same instructions: all sum to the total."""
        for what, parts in (("phases", self.phases), ("functions", self.functions)):
            if abs(sum(parts.values()) - self.total) > 1e-6 * max(self.total, 1):
                raise CountError(f"{self.backend} {self.shape.label}: {what} sum to {sum(parts.values())}, "
                                 f"kinds to {self.total}")
        if any(self.streaming[p] > self.phases[p] for p in self.streaming):
            raise CountError(f"{self.backend} {self.shape.label}: a phase has more streaming than all instructions")
        if set(self.phases) - set(PHASES) or set(self.kinds) - set(KINDS):
            raise CountError(f"{self.backend} {self.shape.label}: unknown phase or kind")


def aggregate(backend: str, shape: Shape, steps_counts: dict[tuple, float], library: str,
              decoded: dict[str, dict[int, tuple[str, objcheck.Insn]]], chains: dict[int, list[str]],
              streaming: set[str]) -> Cell:
    """Each instruction's phase is the outermost role among its call sites in the library (outermost first)
    and then its own inline chain; none: "other" (step loop, batch packing, checks). So the GEMMs, helpers and
    libc/libm code that forward calls count as forward; streaming is decided by the instruction's function."""
    cell = Cell(backend, shape)

    def chain_at(path: str, address: int) -> list[str]:
        if path != library:
            return []
        return chains.get(address) or [decoded.get(path, {}).get(address, ("?", None))[0]]

    for (calls, path, address), n in steps_counts.items():
        symbol, insn = decoded.get(path, {}).get(address, ("?", None))
        own = chain_at(path, address)
        callers = role([f for site in calls for f in chain_at(*site)])
        ph = callers or role(own) or OTHER
        if callers and role(own) not in (None, callers):
            cell.nested += n
        cell.phases[ph] += n
        if path == library and is_streaming(symbol, streaming):
            cell.streaming[ph] += n
        cell.kinds[kind(insn)] += n
        if path != library:
            where = f"{Path(path).name.split('.')[0]}:{symbol}"
        else:  # PLT stubs have no DWARF (the symbolizer names the nearest function): keep objdump's name
            where = " > ".join(own[:2]) if own[:1] == [symbol] else symbol
        cell.functions[f"{where} [{ph}]"] += n
    cell.check()
    return cell


# --- the table --------------------------------------------------------------------------------------------

def fmt(n: float) -> str:
    if not n:
        return "-"
    if n >= 1e5:
        return f"{n / 1e6:.2f}M"
    return f"{n / 1e3:.1f}k" if n >= 1e3 else f"{n:.0f}"


def markdown_table(cells: Iterable[Cell]) -> str:
    """Phase cells read "all (streaming kernels)": a phase's instructions including the GEMMs it calls."""
    columns = ["total", "glue", "streaming kernels", *PHASES, *KINDS]
    lines = ["| backend | d | V | C | L | " + " | ".join(columns) + " |", "|" + " --- |" * (5 + len(columns))]
    for c in cells:
        values = [fmt(c.total), fmt(c.glue), fmt(sum(c.streaming.values()))]
        values += [fmt(c.phases[p]) + (f" ({fmt(c.streaming[p])})" if c.streaming[p] else "") for p in PHASES]
        values += [fmt(c.kinds[k]) for k in KINDS]
        sh = c.shape
        lines.append(f"| {c.backend} | {sh.d_model} | {sh.vocab} | {sh.context} | {sh.n_layers} | " + " | ".join(values)
                     + " |")
    return "\n".join(lines)


def commit_label() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short=10", "HEAD") or "unknown commit"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "backends", "benchmarks")
    return head + (" + uncommitted changes" if dirty else "")


# --- running ----------------------------------------------------------------------------------------------

def tool(*names: str) -> str:
    for name in names:
        if path := shutil.which(name):
            return path
    sys.exit(f"a64_insn_count: {names[0]} not found (apt install llvm-19)")


def build_libraries(lane: Lane, out: Path, only: str | None = None) -> None:
    """The libraries exactly as the lane builds them: through each setup.py, cross-compiled (`only`: a comma
    list of backend directories, as A64_LANE_ONLY)."""
    env = {**os.environ, "SITE": str(out), "A64_LANE_DIR": str(lane.dir)}
    if only and not env.get("A64_LANE_ONLY"):
        env["A64_LANE_ONLY"] = only
    subprocess.run(["bash", str(REPO / "tools/a64lane/build.sh")], check=True, env=env, stdout=subprocess.DEVNULL)


def build_driver(out: Path) -> Path:
    driver = out / "a64_insn_driver"
    subprocess.run(["clang-19", "--target=aarch64-linux-gnu", "-fuse-ld=lld", "-O2", "-Wall", "-Wextra", "-Werror",
                    f"-I{REPO / 'eemicrogpt_core/include'}", str(REPO / "benchmarks/a64_insn_driver.c"),
                    "-ldl", "-o", str(driver)], check=True)
    return driver


def run_driver(lane: Lane, cpu: str, argv: list[str], one_insn_per_tb: bool) -> tuple[str, Counter]:
    """Run the driver under QEMU (host ASLR off, so addresses repeat between runs): executions per PC."""
    env = {**os.environ, "QEMU_CPU": cpu, "QEMU_LD_PREFIX": str(lane.sysroot), "QEMU_LOG": "in_asm,exec,nochain",
           "QEMU_DFILTER": SHARED_OBJECT_REGION}
    env.pop("QEMU_LOG_FILENAME", None)  # the log goes to stderr, piped into awk
    env.pop("QEMU_ONE_INSN_PER_TB", None)
    if one_insn_per_tb:
        env["QEMU_ONE_INSN_PER_TB"] = "1"
    with tempfile.TemporaryFile("w+") as out:
        qemu = subprocess.Popen(["setarch", "-R", str(lane.qemu), *argv], env=env, stdout=out,
                                stderr=subprocess.PIPE)
        awk = subprocess.run(["awk", TB_COUNTER_AWK], stdin=qemu.stderr, capture_output=True, text=True)
        qemu.stderr.close()
        status = qemu.wait()
        out.seek(0)
        stdout = out.read()
    if status or awk.returncode:
        sys.exit(f"a64_insn_count: driver failed ({status}): {awk.stderr.strip()[-2000:]}")
    return stdout, expand_blocks(awk.stdout)


def inline_chains(library: Path, addresses: Iterable[int]) -> dict[int, list[str]]:
    symbolizer = tool("llvm-symbolizer-19", "llvm-symbolizer")
    query = "".join(f"{a:#x}\n" for a in sorted(addresses))
    out = subprocess.run([symbolizer, f"--obj={library}", "--inlines", "--output-style=JSON"], input=query,
                         check=True, capture_output=True, text=True).stdout
    return parse_inline_chains(out)


def address_map(path: Path) -> dict[int, tuple[str, objcheck.Insn]]:
    """ELF virtual address -> (function symbol, instruction) for every instruction llvm-objdump decodes."""
    objdump = objcheck.find_objdump() or tool("llvm-objdump-19")
    return {insn.address: (name, insn) for name, insns in objcheck.disassemble(path, objdump).items()
            for insn in insns}


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def count_cell(lane: Lane, cpu: str, driver: Path, backend: str, library: Path, shape: Shape, batch: int,
               steps: tuple[int, int], streaming: set[str], check: bool) -> Cell:
    argv = [str(driver), str(library), *shape.driver_args(), str(batch)]
    # One fixed filter over the whole region where the loader maps shared objects: a filter built from the
    # reported mappings would itself move libc and libm (QEMU's set-up depends on it). Counts are keyed by
    # (file, ELF address) with each run's own load bases.
    located = {}
    for per_insn in (False, True) if check else (False,):
        runs = []
        for n in steps:
            started = time.monotonic()
            stdout, counts = run_driver(lane, cpu, [*argv, str(n)], per_insn)
            runs.append(locate(counts, mappings(stdout)))
            progress(f"  {backend} {shape.label}, {n} step(s){' one insn per block' if per_insn else ''}: "
                     f"{sum(runs[-1].values()) / 1e6:.2f}M instructions in the filtered files, "
                     f"{time.monotonic() - started:.0f} s")
        located[per_insn] = per_step(*runs, steps)
    if check and located[False] != located[True]:
        differ = sorted(k for k in located[False].keys() | located[True].keys()
                        if located[False].get(k) != located[True].get(k))
        raise CountError(f"{backend} {shape.label}: per-block and per-instruction counts differ at {len(differ)} "
                         f"addresses, first {Path(differ[0][0]).name}+{differ[0][1]:#x}")
    counts = located[False]
    lib = str(library.resolve())
    decoded = {path: address_map(Path(path)) for path in {p for _, p, _ in counts}}
    sites = {site for calls, _, _ in counts for site in calls} | {(p, a) for _, p, a in counts}
    chains = inline_chains(library, {a for p, a in sites if p == lib})
    cell = aggregate(backend, shape, counts, lib, decoded, chains, streaming)
    if cell.nested:
        progress(f"  note: {fmt(cell.nested)} instructions have a role (forward, backward, ...) other than their "
                 "callers' and count in the callers' phase")
    return cell


def find_library(site: Path, backend: str) -> Path | None:
    package, stem = BACKENDS[backend]
    found = sorted((site / package).glob(f"{stem}.*.so"))
    return found[0] if found else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", help=f"comma-separated, of {', '.join(BACKENDS)} (default: "
                        f"{', '.join(DEFAULT_BACKENDS)} and any other that this checkout builds)")
    parser.add_argument("--d-models", default="64,128")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES,
                        help=f"comma-separated vocab:context:n_layers, each at every d_model ({DEFAULT_SHAPES})")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--cpu", default=APPLE_PROFILE, help=f"QEMU_CPU (default Apple M4/M5: {APPLE_PROFILE})")
    parser.add_argument("--steps", default="1,2", help="the two step counts subtracted (S1,S2; default 1,2)")
    parser.add_argument("--functions", action="store_true", help="also print the per-function breakdown")
    parser.add_argument("--check", action="store_true",
                        help="also count one instruction per block (~5x slower) and require identical counts")
    parser.add_argument("--site", type=Path, help="use libraries already built there (a lane site dir)")
    parser.add_argument("--smoke", action="store_true",
                        help=f"a tiny run that proves the script works: {SMOKE['backends']} at d{SMOKE['d_models']}, "
                             f"shape {SMOKE['shapes']}, batch {SMOKE['batch']} (builds only that backend)")
    args = parser.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    try:
        steps = tuple(int(s) for s in args.steps.split(","))
        d_models = [int(d) for d in args.d_models.split(",")]
        shapes = [Shape(d, *(int(v) for v in spec.split(":", 2))) for d in d_models for spec in args.shapes.split(",")]
    except (ValueError, TypeError):
        parser.error("--steps and --d-models take comma-separated integers, --shapes vocab:context:n_layers items")
    if len(steps) != 2 or not 0 <= steps[0] < steps[1]:
        parser.error("--steps takes two step counts S1 < S2")
    wanted = args.backends.split(",") if args.backends else list(BACKENDS)
    if unknown := [b for b in wanted if b not in BACKENDS]:
        parser.error(f"unknown backend(s) {', '.join(unknown)}; known: {', '.join(BACKENDS)}")
    lane = Lane.find()
    streaming = objcheck.streaming_functions(REPO / "backends/sme2_common/sme2_gemm.c")
    label = commit_label()
    started = time.monotonic()
    cells = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        site = args.site or work / "site"
        if args.site is None:
            progress("building the libraries through their setup.py (the lane's build stage) ...")
            build_libraries(lane, site, only="neon" if args.smoke else None)
        driver = build_driver(work)
        libraries = {b: find_library(site, b) for b in wanted}
        for backend, library in libraries.items():
            if library is None and (args.backends or backend in DEFAULT_BACKENDS):
                sys.exit(f"a64_insn_count: {backend}: no library {BACKENDS[backend][1]}.*.so in "
                         f"{site / BACKENDS[backend][0]} (not built by this checkout)")
        for backend in (b for b, lib in libraries.items() if lib is None):
            progress(f"{backend}: not built by this checkout, left out")
        todo = [(b, lib, sh) for b, lib in libraries.items() if lib is not None for sh in shapes]
        try:
            for i, (backend, library, sh) in enumerate(todo, 1):
                progress(f"[{i}/{len(todo)}] {backend} {sh.label} ({time.monotonic() - started:.0f} s so far)")
                cells.append(count_cell(lane, args.cpu, driver, backend, library, sh, args.batch, steps, streaming,
                                        args.check))
        except CountError as e:
            sys.exit(f"a64_insn_count: {e}")
    if args.functions:
        for cell in cells:
            print(f"\n{cell.backend} {cell.shape.label}: per function (symbol > outermost inlined) [phase], per step")
            for function, n in cell.functions.most_common(30):
                print(f"  {fmt(n):>8}  {function}")
    print(f"\nInstructions per training step (batch {args.batch}, {N_HEADS} heads, QEMU_CPU={args.cpu}, "
          f"commit {label}; steps {steps[1]} - {steps[0]}{', cross-checked per instruction' if args.check else ''}):"
          "\n")
    print(markdown_table(cells))
    progress(f"whole table: {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
