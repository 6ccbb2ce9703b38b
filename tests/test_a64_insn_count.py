"""benchmarks/a64_insn_count.py without QEMU: its awk block counter on a synthetic QEMU log, the subtraction of
two runs, the mapping of PCs to files, functions, phases and kinds, and the Markdown table (runs on any host
with awk; the real counts come from the aarch64 lane's QEMU, see the script)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("a64_insn_count", REPO / "benchmarks/a64_insn_count.py")
insn_count = importlib.util.module_from_spec(_spec)
sys.modules["a64_insn_count"] = insn_count  # dataclasses resolve annotations through sys.modules
_spec.loader.exec_module(insn_count)
objcheck = insn_count.objcheck

LIB = "/site/pkg/_emg_sme2.so"
LIBC = "/sysroot/lib/libc.so.6"

# QEMU's in_asm,exec,nochain log. A `ret` block runs first, with no call to return from. Block A (2 instructions,
# ending in a call) is translated and run; block B (ending in `ret`) is translated twice in a row (the first
# translation was discarded) and runs inside A's call; A runs again and calls B again (a line from the driver in
# between); after a code-buffer flush A is translated again at a new host address, runs and calls B once more.
QEMU_LOG = """\
----------------
IN: exit
0x00007ffff5b00010:  d65f03c0  ret

Trace 0: 0x7fffee400000 [80083009301/00007ffff5b00010/00000001/00000200] exit
----------------
IN: loss_and_grad
0x00007ffff7e01000:  8b020020  add      x0, x1, x2
0x00007ffff7e01004:  940003ff  bl       #0x7ffff7e02000

Trace 0: 0x7fffee400100 [80083009301/00007ffff7e01000/00000001/00000200] loss_and_grad
----------------
IN: gemm_body
0x00007ffff7e02000:  d503201f  nop
----------------
IN: gemm_body
0x00007ffff7e02000:  d503201f  nop
0x00007ffff7e02004:  80800000  fmopa    za0.s, p0/m, p0/m, z0.s, z0.s
0x00007ffff7e02008:  d65f03c0  ret

Trace 0: 0x7fffee400200 [80083009301/00007ffff7e02000/00000001/00000200] gemm_body
Trace 0: 0x7fffee400100 [80083009301/00007ffff7e01000/00000001/00000200] loss_and_grad
a64_insn_driver: a message from the driver
Trace 0: 0x7fffee400200 [80083009301/00007ffff7e02000/00000001/00000200] gemm_body
----------------
IN: loss_and_grad
0x00007ffff7e01000:  8b020020  add      x0, x1, x2
0x00007ffff7e01004:  940003ff  bl       #0x7ffff7e02000

Trace 0: 0x7fffee400300 [80083009301/00007ffff7e01000/00000001/00000200] loss_and_grad
Trace 0: 0x7fffee400200 [80083009301/00007ffff7e02000/00000001/00000200] gemm_body
"""

DRIVER_STDOUT = f"""\
base {LIBC} 0x7ffff5b00000
text {LIBC} 0x7ffff5b00000 0x7ffff5c8c000
base {LIB} 0x7ffff7df0000
text {LIB} 0x7ffff7e01000 0x7ffff7e07000
trained
"""

OBJDUMP = """\

/site/pkg/_emg_sme2.so:\tfile format elf64-littleaarch64

Disassembly of section .text:

0000000000011000 <loss_and_grad>:
   11000:      \tadd\tx0, x1, x2
   11004:      \tfadd\tv0.4s, v1.4s, v2.4s
   11008:      \tbl\t0x12000 <gemm_body>
   1100c:      \tldr\tq0, [x0, #0x10]
   11010:      \tfmul\ts0, s1, s2

0000000000012000 <gemm_body>:
   12000:      \tnop
   12004:      \tfmopa\tza0.s, p0/m, p0/m, z0.s, z0.s
   12008:      \tret

0000000000013000 <transpose_op>:
   13000:      \tzip1\tv0.4s, v1.4s, v2.4s
   13004:      \tbl\t0x13000 <transpose_op>
"""


def symbolizer_line(address: int, inner_to_outer: list[str]) -> str:
    return json.dumps({"Address": hex(address), "ModuleName": LIB,
                       "Symbol": [{"FunctionName": f, "Line": 1} for f in inner_to_outer]})


@pytest.fixture(scope="module")
def awk() -> str:
    path = shutil.which("awk")
    if path is None:
        pytest.skip("no awk on this host (the script needs it too)")
    return path


def test_awk_counts_every_instruction_of_each_executed_block_under_its_call_stack(awk):
    out = subprocess.run([awk, insn_count.TB_COUNTER_AWK], input=QEMU_LOG, capture_output=True, text=True,
                         check=True)
    assert out.stderr.strip() == "a64_insn_driver: a message from the driver"
    counts = insn_count.expand_blocks(out.stdout)
    call = (0x7FFFF7E01004,)
    assert counts == {((), 0x7FFFF5B00010): 1,
                      ((), 0x7FFFF7E01000): 3, ((), 0x7FFFF7E01004): 3,  # A: 2 runs + 1 of its re-translation
                      (call, 0x7FFFF7E02000): 3, (call, 0x7FFFF7E02004): 3, (call, 0x7FFFF7E02008): 3}


def test_a_block_without_listing_is_an_error(awk):
    log = "Trace 0: 0x7fffee400100 [80083009301/00007ffff7e01000/00000001/00000200] f\n"
    out = subprocess.run([awk, insn_count.TB_COUNTER_AWK], input=log, capture_output=True, text=True, check=True)
    with pytest.raises(insn_count.CountError, match="without its in_asm listing"):
        insn_count.expand_blocks(out.stdout)


def test_pcs_and_call_sites_map_to_file_addresses_and_others_are_dropped():
    maps = insn_count.mappings(DRIVER_STDOUT)
    assert maps[LIB].base == 0x7FFFF7DF0000 and maps[LIB].text == [(0x7FFFF7E01000, 0x7FFFF7E07000)]
    driver_call, lib_call = 0x555555550010, 0x7FFFF7E01004
    counts = Counter({((driver_call,), 0x7FFFF7E01000): 4, ((driver_call, lib_call), 0x7FFFF5B00010): 2,
                      ((), 0x7FFFF7E07000): 9, ((), 0x555555550000): 7})
    assert insn_count.locate(counts, maps) == {((), LIB, 0x11000): 4, (((LIB, 0x11004),), LIBC, 0x10): 2}


def test_two_runs_subtract_to_per_step_counts():
    short = Counter({((), LIB, 0x11000): 10, ((), LIB, 0x11004): 3, ((), LIBC, 0x10): 5})
    long = Counter({((), LIB, 0x11000): 16, ((), LIB, 0x11004): 3, ((), LIBC, 0x10): 9, ((), LIB, 0x12000): 2})
    assert insn_count.per_step(short, long, (1, 3)) == {((), LIB, 0x11000): 3, ((), LIBC, 0x10): 2,
                                                        ((), LIB, 0x12000): 1}
    with pytest.raises(insn_count.CountError, match="ran more often in the 1-step run"):
        insn_count.per_step(long, short, (1, 3))


def test_inline_chains_read_outermost_first():
    text = symbolizer_line(0x11004, ["rms_forward", "forward", "loss_and_grad"]) + "\n"
    text += json.dumps({"Address": "0x13000", "Symbol": []}) + "\n"
    assert insn_count.parse_inline_chains(text) == {0x11004: ["loss_and_grad", "forward", "rms_forward"],
                                                    0x13000: []}


def test_role_is_the_outermost_in_the_chain_and_streaming_is_by_symbol():
    assert insn_count.role(["loss_and_grad", "forward", "rms_forward"]) == "forward"
    assert insn_count.role(["loss_grad", "seq_backward", "seq_forward"]) == "backward"
    assert insn_count.role(["emg_train_steps", "adam"]) == "Adam"
    assert insn_count.role(["sync_transposed"]) == "weight operands"
    assert insn_count.role(["transpose_op", "transpose_to"]) is None
    assert insn_count.is_streaming("gemm_body", {"gemm_body"})
    assert insn_count.is_streaming("sme_gemm_many", set()) and insn_count.is_streaming("__arm_tpidr2_save", set())
    assert not insn_count.is_streaming("loss_and_grad", {"gemm_body"})


def test_kinds():
    def k(mnemonic: str, operands: str) -> str:
        return insn_count.kind(objcheck.Insn(0, mnemonic, operands))
    assert k("fmopa", "za0.s, p0/m, p0/m, z0.s, z1.s") == "SME/SVE"
    assert k("whilelo", "pn8.s, x0, x1, vlx2") == "SME/SVE"
    assert k("ldr", "q0, [x0, #0x10]") == "ld/st"
    assert k("ldp", "x19, x20, [sp, #0x10]") == "ld/st"
    assert k("fmla", "v0.4s, v1.4s, v2.s[1]") == "Neon/FP"
    assert k("fadd", "s0, s1, s2") == "Neon/FP"
    assert k("add", "x0, x1, x2") == "scalar"
    assert k("b.ne", "0x1000") == "scalar"
    assert insn_count.kind(None) == "scalar"


def test_aggregate_splits_each_step_by_phase_and_kind_and_renders_the_table():
    functions = objcheck.parse_disassembly(OBJDUMP)
    assert [i.mnemonic for i in functions["loss_and_grad"]] == ["add", "fadd", "bl", "ldr", "fmul"]
    decoded = {LIB: {i.address: (name, i) for name, insns in functions.items() for i in insns},
               LIBC: {0x10: ("memcpy", objcheck.Insn(0x10, "stp", "q0, q1, [x0]"))}}
    chains = insn_count.parse_inline_chains("\n".join([
        symbolizer_line(0x11000, ["loss_and_grad"]),
        symbolizer_line(0x11004, ["forward", "loss_and_grad"]),
        symbolizer_line(0x11008, ["forward", "loss_and_grad"]),
        symbolizer_line(0x1100C, ["backward", "loss_and_grad"]),
        symbolizer_line(0x11010, ["adam", "loss_and_grad"]),
        symbolizer_line(0x13004, ["transpose_op"]),
    ]))
    from_forward = ((LIB, 0x11008),)  # gemm_body, transpose_op and memcpy called from forward
    from_no_role = ((LIB, 0x13004),)  # ... and from a call site without a role
    steps = {((), LIB, 0x11000): 10, ((), LIB, 0x11004): 20, ((), LIB, 0x1100C): 30, ((), LIB, 0x11010): 40,
             (from_forward, LIB, 0x12004): 500, (from_forward, LIB, 0x12008): 5, (from_forward, LIB, 0x13000): 7,
             (from_no_role, LIB, 0x13000): 1, (from_forward, LIBC, 0x10): 3}
    shape = insn_count.Shape(64, 27, 16, 1)
    cell = insn_count.aggregate("sme2_f32", shape, steps, LIB, decoded, chains, {"gemm_body"})
    assert cell.total == 616 and cell.glue == 111
    assert cell.phases == {"forward": 535, "backward": 30, "Adam": 40, "other": 11}
    assert cell.streaming == {"forward": 505}
    assert cell.kinds == {"SME/SVE": 500, "Neon/FP": 68, "ld/st": 33, "scalar": 15}
    assert cell.functions["loss_and_grad > forward [forward]"] == 20
    assert cell.functions["gemm_body [forward]"] == 505
    assert cell.functions["libc:memcpy [forward]"] == 3
    assert cell.nested == 0
    nested = insn_count.aggregate("sme2_f32", shape, {(from_forward, LIB, 0x1100C): 2}, LIB, decoded, chains, set())
    assert nested.phases == {"forward": 2} and nested.nested == 2  # backward's code called from forward
    table = insn_count.markdown_table([cell]).splitlines()
    assert table[0] == ("| backend | d | V | C | L | total | glue | streaming kernels | forward | backward | weight "
                        "operands | Adam | other | SME/SVE | Neon/FP | ld/st | scalar |")
    assert table[2] == ("| sme2_f32 | 64 | 27 | 16 | 1 | 616 | 111 | 505 | 535 (505) | 30 | - | 40 | 11 | 500 | 68 "
                        "| 33 | 15 |")


def test_check_rejects_phases_that_do_not_add_up():
    cell = insn_count.Cell("neon", insn_count.Shape(128, 27, 16, 1), phases=Counter({"forward": 5}),
                           kinds=Counter({"scalar": 6}), functions=Counter({"f": 6}))
    with pytest.raises(insn_count.CountError, match="phases sum to 5"):
        cell.check()


def test_number_format():
    assert [insn_count.fmt(n) for n in (0, 41, 4_100, 99_999, 1_729_687, 45_000_000)] == \
        ["-", "41", "4.1k", "100.0k", "1.73M", "45.00M"]
