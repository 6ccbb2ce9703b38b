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

# QEMU's in_asm,exec,nochain log: block A (2 instructions) translated, then run 3 times; block B translated
# twice in a row (the first translation was discarded) and run once; after a code-buffer flush block A is
# translated again at a new host address and run twice more; one line from the driver in between.
QEMU_LOG = """\
----------------
IN: loss_and_grad
0x00007ffff7e01000:  8b020020  add      x0, x1, x2
0x00007ffff7e01004:  54000041  b.ne     #0x7ffff7e0100c

Trace 0: 0x7fffee400100 [80083009301/00007ffff7e01000/00000001/00000200] loss_and_grad
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
----------------
IN: loss_and_grad
0x00007ffff7e01000:  8b020020  add      x0, x1, x2
0x00007ffff7e01004:  54000041  b.ne     #0x7ffff7e0100c

Trace 0: 0x7fffee400300 [80083009301/00007ffff7e01000/00000001/00000200] loss_and_grad
Trace 0: 0x7fffee400300 [80083009301/00007ffff7e01000/00000001/00000200] loss_and_grad
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
   11008:      \tldr\tq0, [x0, #0x10]
   1100c:      \tfmul\ts0, s1, s2

0000000000012000 <gemm_body>:
   12000:      \tnop
   12004:      \tfmopa\tza0.s, p0/m, p0/m, z0.s, z0.s
   12008:      \tret

0000000000013000 <transpose_op>:
   13000:      \tzip1\tv0.4s, v1.4s, v2.4s
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


def test_awk_counts_every_instruction_of_each_executed_block(awk):
    out = subprocess.run([awk, insn_count.TB_COUNTER_AWK], input=QEMU_LOG, capture_output=True, text=True,
                         check=True)
    assert out.stderr.strip() == "a64_insn_driver: a message from the driver"
    counts = insn_count.expand_blocks(out.stdout)
    assert counts == {0x7FFFF7E01000: 5, 0x7FFFF7E01004: 5,  # block A: 3 runs + 2 runs of its re-translation
                      0x7FFFF7E02000: 1, 0x7FFFF7E02004: 1, 0x7FFFF7E02008: 1}  # block B: its last listing


def test_a_block_without_listing_is_an_error(awk):
    log = "Trace 0: 0x7fffee400100 [80083009301/00007ffff7e01000/00000001/00000200] f\n"
    out = subprocess.run([awk, insn_count.TB_COUNTER_AWK], input=log, capture_output=True, text=True, check=True)
    with pytest.raises(insn_count.CountError, match="without its in_asm listing"):
        insn_count.expand_blocks(out.stdout)


def test_pcs_map_to_file_addresses_and_others_are_dropped():
    maps = insn_count.mappings(DRIVER_STDOUT)
    assert maps[LIB].base == 0x7FFFF7DF0000 and maps[LIB].text == [(0x7FFFF7E01000, 0x7FFFF7E07000)]
    counts = Counter({0x7FFFF7E01000: 4, 0x7FFFF5B00010: 2, 0x7FFFF7E07000: 9, 0x555555550000: 7})
    assert insn_count.locate(counts, maps) == {(LIB, 0x11000): 4, (LIBC, 0x10): 2}


def test_two_runs_subtract_to_per_step_counts():
    short = Counter({(LIB, 0x11000): 10, (LIB, 0x11004): 3, (LIBC, 0x10): 5})
    long = Counter({(LIB, 0x11000): 16, (LIB, 0x11004): 3, (LIBC, 0x10): 9, (LIB, 0x12000): 2})
    assert insn_count.per_step(short, long, (1, 3)) == {(LIB, 0x11000): 3, (LIBC, 0x10): 2, (LIB, 0x12000): 1}
    with pytest.raises(insn_count.CountError, match="ran more often in the 1-step run"):
        insn_count.per_step(long, short, (1, 3))


def test_inline_chains_read_outermost_first():
    text = symbolizer_line(0x11004, ["rms_forward", "forward", "loss_and_grad"]) + "\n"
    text += json.dumps({"Address": "0x13000", "Symbol": []}) + "\n"
    assert insn_count.parse_inline_chains(text) == {0x11004: ["loss_and_grad", "forward", "rms_forward"],
                                                    0x13000: []}


def test_phase_is_the_outermost_role_in_the_chain_and_streaming_by_symbol():
    streaming = {"gemm_body"}
    assert insn_count.phase("loss_and_grad", ["loss_and_grad", "forward", "rms_forward"], streaming) == "forward"
    assert insn_count.phase("loss_and_grad", ["loss_and_grad", "backward", "seq_forward"], streaming) == "backward"
    assert insn_count.phase("emg_train_steps", ["emg_train_steps", "adam"], streaming) == "Adam"
    assert insn_count.phase("sync_transposed", [], streaming) == "weight operands"
    assert insn_count.phase("gemm_body", ["gemm_body", "put_vec"], streaming) == insn_count.STREAMING
    assert insn_count.phase("sme_gemm_many", [], streaming) == insn_count.STREAMING
    assert insn_count.phase("__arm_tpidr2_save", [], streaming) == insn_count.STREAMING
    assert insn_count.phase("transpose_op", ["transpose_op"], streaming) == insn_count.OTHER_GLUE


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
    assert [i.mnemonic for i in functions["loss_and_grad"]] == ["add", "fadd", "ldr", "fmul"]
    decoded = {LIB: {i.address: (name, i) for name, insns in functions.items() for i in insns},
               LIBC: {0x10: ("memcpy", objcheck.Insn(0x10, "stp", "q0, q1, [x0]"))}}
    chains = insn_count.parse_inline_chains("\n".join([
        symbolizer_line(0x11000, ["loss_and_grad"]),
        symbolizer_line(0x11004, ["forward", "loss_and_grad"]),
        symbolizer_line(0x11008, ["backward", "loss_and_grad"]),
        symbolizer_line(0x1100C, ["adam", "loss_and_grad"]),
    ]))
    steps = {(LIB, 0x11000): 10, (LIB, 0x11004): 20, (LIB, 0x11008): 30, (LIB, 0x1100C): 40,
             (LIB, 0x12004): 500, (LIB, 0x12008): 5, (LIB, 0x13000): 7, (LIBC, 0x10): 3}
    cell = insn_count.aggregate("sme2_f32", 64, steps, LIB, decoded, chains, {"gemm_body"})
    assert cell.total == 615 and cell.glue == 110
    assert cell.phases == {"streaming kernels": 505, "forward": 20, "backward": 30, "Adam": 40,
                           "other glue": 17, "libc/libm": 3}
    assert cell.kinds == {"SME/SVE": 500, "Neon/FP": 67, "ld/st": 33, "scalar": 15}
    assert cell.functions["loss_and_grad > forward [forward]"] == 20
    assert cell.functions["libc:memcpy [libc/libm]"] == 3
    table = insn_count.markdown_table([cell]).splitlines()
    assert table[0] == ("| backend | d | total | glue | streaming kernels | forward | backward | weight operands | "
                        "Adam | other glue | libc/libm | SME/SVE | Neon/FP | ld/st | scalar |")
    assert table[2] == "| sme2_f32 | 64 | 615 | 110 | 505 | 20 | 30 | - | 40 | 17 | 3 | 500 | 67 | 33 | 15 |"


def test_check_rejects_phases_that_do_not_add_up():
    cell = insn_count.Cell("neon", 128, phases=Counter({"forward": 5}), kinds=Counter({"scalar": 6}),
                           functions=Counter({"f": 6}))
    with pytest.raises(insn_count.CountError, match="phases sum to 5"):
        cell.check()


def test_number_format():
    assert [insn_count.fmt(n) for n in (0, 41, 4_100, 99_999, 1_729_687, 45_000_000)] == \
        ["-", "41", "4.1k", "100.0k", "1.73M", "45.00M"]
