"""Every C-side fact of the model, checked against eemicrogpt_core/model.py (and optim.py, native.py).

A tiny C program includes the shared layer's header (include/emg_backend.h, which every native backend
builds on), prints its constants, the parameter layout per width and the shape rule, and the test compares
each number with the Python definition. The ABI behaviour itself is tested per backend by
eemicrogpt_core/abi_testing.py.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from eemicrogpt_core import model, native, optim
from eemicrogpt_core.model import ModelShape, ShapeError

WIDTHS = (4, 8, 16, 24, 32, 48, 64, 96, 128, 256)
FIELDS = ("n_params", *model.TENSOR_NAMES)
PROGRAM = r"""
#include <stdio.h>
#include "emg_backend.h"
static const int widths[] = {@WIDTHS@};
int main(void) {
    printf("VOCAB %d\nBOUNDARY %d\nMAX_SEQ %d\nMAX_BATCH %d\nABI_VERSION %d\n", EMG_VOCAB, EMG_BOUNDARY,
           EMG_MAX_SEQ, EMG_MAX_BATCH, EMG_ABI_VERSION);
    printf("RMS_EPS %.9g\nADAM_BETA1 %.9g\nADAM_BETA2 %.9g\nADAM_EPS %.9g\n", (double)EMG_RMS_EPS,
           (double)EMG_ADAM_BETA1, (double)EMG_ADAM_BETA2, (double)EMG_ADAM_EPS);
    for (unsigned i = 0; i < sizeof widths / sizeof widths[0]; i++) {
        const int d = widths[i];
        const emg_layout L = emg_layout_of(d);
        /* the compile-time macros the kernels use must agree with the struct the layer uses */
        const int same = L.n_params == EMG_N_PARAMS(d) && L.wq == EMG_OFF_WQ(d) && L.wlm == EMG_OFF_WLM(d);
        printf("layout %d %d %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld\n", d, same, L.n_params, L.tok_emb,
               L.pos_emb, L.wq, L.wk, L.wv, L.wo, L.wf1, L.wf2, L.wlm);
    }
    for (int d = -4; d <= 130; d++)
        for (int h = -1; h <= 40; h++) printf("valid %d %d %d\n", d, h, emg_shape_valid(d, h));
    return 0;
}
"""


@pytest.fixture(scope="module")
def c_facts(tmp_path_factory: pytest.TempPathFactory) -> list[list[str]]:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.fail("no C compiler (cc, gcc or clang) to compile the layout check with", pytrace=False)
    work = tmp_path_factory.mktemp("layout")
    source = work / "layout.c"
    source.write_text(PROGRAM.replace("@WIDTHS@", ", ".join(map(str, WIDTHS))))
    binary = work / "layout"
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-I", native.get_include(), str(source), "-o", str(binary),
                    "-lm"], check=True)
    out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    return [line.split() for line in out.splitlines()]


def _constants(facts: list[list[str]]) -> dict[str, str]:
    return {row[0]: row[1] for row in facts if len(row) == 2}


def test_constants_match_the_python_side(c_facts: list[list[str]]) -> None:
    c = _constants(c_facts)
    assert int(c["VOCAB"]) == model.VOCAB
    assert int(c["BOUNDARY"]) == model.BOUNDARY
    assert int(c["MAX_SEQ"]) == model.MAX_SEQ
    assert int(c["MAX_BATCH"]) == native.MAX_BATCH
    assert int(c["ABI_VERSION"]) == native.ABI_VERSION
    # the C constants are float literals printed with 9 digits (enough to round-trip a float32)
    for name, value in (("RMS_EPS", model.RMS_EPS), ("ADAM_BETA1", optim.ADAM_BETA1),
                        ("ADAM_BETA2", optim.ADAM_BETA2), ("ADAM_EPS", optim.ADAM_EPS)):
        assert np.float32(c[name]) == np.float32(value), name


def test_parameter_layout_matches_model_py(c_facts: list[list[str]]) -> None:
    rows = [row for row in c_facts if row[0] == "layout"]
    assert [int(row[1]) for row in rows] == list(WIDTHS)
    for row in rows:
        d, macros_agree, numbers = int(row[1]), row[2] == "1", [int(x) for x in row[3:]]
        shape = ModelShape(d, 1)
        want = [shape.n_params, *(shape.offsets[name] for name in model.TENSOR_NAMES)]
        assert dict(zip(FIELDS, numbers, strict=True)) == dict(zip(FIELDS, want, strict=True)), f"d_model {d}"
        assert macros_agree, f"EMG_N_PARAMS / EMG_OFF_* disagree with emg_layout_of at d_model {d}"
        # the documented n_params formula and the sum of the tensor sizes agree too
        assert shape.n_params == sum(r * c for r, c in shape.tensor_shapes.values())


def test_shape_rule_matches_model_shape(c_facts: list[list[str]]) -> None:
    checked = 0
    for row in c_facts:
        if row[0] != "valid":
            continue
        d, h, c_valid = int(row[1]), int(row[2]), row[3] == "1"
        try:
            ModelShape(d, h)
            py_valid = True
        except ShapeError:
            py_valid = False
        assert c_valid == py_valid, (d, h)
        checked += 1
    assert checked == 135 * 42


def test_the_header_is_shipped_with_the_core() -> None:
    include = Path(native.get_include())
    assert (include / "eemicrogpt.h").is_file() and (include / "emg_backend.h").is_file()
