"""Every C-side fact of the model, checked against eemicrogpt_core/model/shape.py (and optim.py, abi.py, native.py).

A tiny C program includes the shared layer's header (include/emg_backend.h, which every native backend
builds on), prints its constants, the parameter layout of a set of shapes (emg_layout_of, emg_layer_offset
and the EMG_LAYER_* offsets), the shape rule over a grid, the emg_shape and emg_optimizer structs' layouts,
the optimiser rule over a grid and the clipping of a few gradients, and the test compares each number with
the Python definition. The ABI behaviour itself is tested per backend by
eemicrogpt_core/kit/abi_contract.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from eemicrogpt_core.backends import native
from eemicrogpt_core.base import abi
from eemicrogpt_core.model import optim
from eemicrogpt_core.model import shape as model
from eemicrogpt_core.model.shape import LAYER_TENSORS, ModelShape, layer_tensor

# (d_model, n_heads, n_layers, vocab, context): the seed's shapes, the envelope's corners, non-powers of two
LAYOUT_SHAPES = [
    (16, 4, 1, 27, 16), (64, 4, 1, 27, 16), (128, 8, 1, 27, 16), (256, 4, 1, 27, 16),
    (4, 1, 1, 2, 1), (48, 4, 2, 64, 33), (80, 4, 4, 27, 16), (96, 8, 3, 100, 32), (16, 4, 8, 256, 64),
    (256, 64, 8, 256, 64), (16, 4, 12, 27, 256), (1024, 8, 12, 256, 256),
]
# The shape rule's grid: width x heads at the seed's depth, vocabulary and context, then the other three
# fields across their bounds at a valid width.
WIDTH_GRID = [(d, h, 1, 27, 16) for d in (*range(-4, 131), 1008, 1020, 1024, 1025, 1040)
              for h in (*range(-1, 41), 255, 256, 257)]
OTHER_GRID = [(16, 4, layers, vocab, context) for layers, vocab, context in itertools.product(
    (-1, 0, 1, 2, 7, 8, 9, 11, 12, 13), (-1, 0, 1, 2, 3, 27, 255, 256, 257, 1000),
    (-1, 0, 1, 2, 63, 64, 65, 255, 256, 257))]
# The optimiser rule's grid: each field across its range's edges from the defaults (values float32 holds
# exactly, so C and Python compare the same numbers), and all fields set at once.
_OPT_VALUES = {
    "beta1": (-0.5, -0.0, 0.0, 0.5, 0.875, 1.0, 1.5, math.nan, math.inf),
    "beta2": (-0.25, 0.0, 0.9375, 1.0, 2.0, math.nan, -math.inf),
    "eps": (-1.0, 0.0, 2.0**-30, 1.0, 2.0**99, 2.0**100, math.inf, math.nan),
    "weight_decay": (-0.5, -0.0, 0.0, 0.125, 2.0**99, 2.0**100, math.inf, math.nan),
    "grad_clip": (-1.0, 0.0, 0.5, 2.0**99, 2.0**100, math.inf, math.nan),
}
OPTIMIZER_GRID = [
    dataclasses.replace(optim.DEFAULT_OPTIMIZER, **{field: value}) for field, values in _OPT_VALUES.items()
    for value in values
] + [optim.OptimizerSettings(0.5, 0.875, 2.0**-20, 0.125, 0.5)]
# Gradients whose sums of squares are exact (norm 13), and clipping values around that norm (0: off).
CLIP_GRADIENT = (3.0, -4.0, 0.0, 12.0)
CLIP_VALUES = (0.0, 1.0, 6.5, 13.0, 26.0)
LAYER_MACROS = {name: f"EMG_LAYER_{name.upper()}" for name in LAYER_TENSORS}

PROGRAM = r"""
#include <stddef.h>
#include <stdio.h>
#include "emg_backend.h"
static const int shapes[][5] = {@SHAPES@};
static const int grid[][5] = {@GRID@};
static const float opts[][5] = {@OPTS@};
static const float clips[] = {@CLIPS@};
int main(void) {
    printf("ABI_VERSION %d\nMIN_VOCAB %d\nMAX_VOCAB %d\nMAX_CONTEXT %d\nMAX_LAYERS %d\nMAX_BATCH %d\n",
           EMG_ABI_VERSION, EMG_MIN_VOCAB, EMG_MAX_VOCAB, EMG_MAX_CONTEXT, EMG_MAX_LAYERS, EMG_MAX_BATCH);
    printf("MAX_D_MODEL %d\nD_MODEL_STEP %d\n", EMG_MAX_D_MODEL, EMG_D_MODEL_STEP);
    printf("RMS_EPS %.9g\nADAM_BETA1 %.9g\nADAM_BETA2 %.9g\nADAM_EPS %.9g\n", (double)EMG_RMS_EPS,
           (double)EMG_ADAM_BETA1, (double)EMG_ADAM_BETA2, (double)EMG_ADAM_EPS);
    printf("EMG_OK %d\nEMG_ERR_ARGUMENT %d\nEMG_ERR_UNSUPPORTED %d\nEMG_ERR_NOMEM %d\nEMG_ERR_NONFINITE %d\n",
           EMG_OK, EMG_ERR_ARGUMENT, EMG_ERR_UNSUPPORTED, EMG_ERR_NOMEM, EMG_ERR_NONFINITE);
    printf("struct %zu %zu %zu %zu %zu %zu\n", sizeof(emg_shape), offsetof(emg_shape, d_model),
           offsetof(emg_shape, n_heads), offsetof(emg_shape, n_layers), offsetof(emg_shape, vocab),
           offsetof(emg_shape, context));
    for (unsigned i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const emg_shape s = {shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4]};
        const emg_layout L = emg_layout_of(&s);
        const long d = s.d_model;
        printf("layout %d %d %d %d %d %ld %ld %ld %ld %ld %ld %d", s.d_model, s.n_heads, s.n_layers, s.vocab,
               s.context, L.n_params, L.tok_emb, L.pos_emb, L.wlm, L.layer_size, EMG_LAYER_SIZE(d),
               emg_seq_len(&s));
        for (int l = 0; l < s.n_layers; l++) printf(" %ld", emg_layer_offset(&L, l));
        printf("\n");
        printf("within %ld %ld %ld %ld %ld %ld %ld\n", d, EMG_LAYER_WQ(d), EMG_LAYER_WK(d), EMG_LAYER_WV(d),
               EMG_LAYER_WO(d), EMG_LAYER_WF1(d), EMG_LAYER_WF2(d));
    }
    for (unsigned i = 0; i < sizeof grid / sizeof grid[0]; i++) {
        const emg_shape s = {grid[i][0], grid[i][1], grid[i][2], grid[i][3], grid[i][4]};
        printf("valid %d %d %d %d %d %d\n", s.d_model, s.n_heads, s.n_layers, s.vocab, s.context,
               emg_shape_valid(&s));
    }
    printf("valid_null %d\n", emg_shape_valid(NULL));
    printf("optstruct %zu %zu %zu %zu %zu %zu\n", sizeof(emg_optimizer), offsetof(emg_optimizer, beta1),
           offsetof(emg_optimizer, beta2), offsetof(emg_optimizer, eps), offsetof(emg_optimizer, weight_decay),
           offsetof(emg_optimizer, grad_clip));
    const emg_optimizer d = emg_default_optimizer();
    printf("optdefault %.9g %.9g %.9g %.9g %.9g\n", (double)d.beta1, (double)d.beta2, (double)d.eps,
           (double)d.weight_decay, (double)d.grad_clip);
    for (unsigned i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        const emg_optimizer o = {opts[i][0], opts[i][1], opts[i][2], opts[i][3], opts[i][4]};
        printf("optvalid %u %d\n", i, emg_optimizer_valid(&o));
    }
    printf("optvalid_null %d\n", emg_optimizer_valid(NULL));
    for (unsigned i = 0; i < sizeof clips / sizeof clips[0]; i++) {
        float g[] = {@CLIP_GRADIENT@};
        const float factor = emg_clip_gradients(g, sizeof g / sizeof g[0], clips[i]);
        printf("clip %u %.9g", i, (double)factor);
        for (unsigned j = 0; j < sizeof g / sizeof g[0]; j++) printf(" %.9g", (double)g[j]);
        printf("\n");
    }
    return 0;
}
"""


def _c_array(rows: list[tuple[int | str, ...]]) -> str:
    return ", ".join("{" + ", ".join(map(str, row)) + "}" for row in rows)


def _c_float(value: float) -> str:
    """A C expression for a float: NAN, INFINITY, or the exact hexadecimal literal."""
    if math.isnan(value):
        return "NAN"
    if math.isinf(value):
        return "INFINITY" if value > 0 else "-INFINITY"
    return value.hex()


@pytest.fixture(scope="module")
def c_facts(tmp_path_factory: pytest.TempPathFactory) -> list[list[str]]:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.fail("no C compiler (cc, gcc or clang) to compile the layout check with", pytrace=False)
    work = tmp_path_factory.mktemp("layout")
    source = work / "layout.c"
    opts = [tuple(_c_float(v) for v in dataclasses.astuple(opt)) for opt in OPTIMIZER_GRID]
    source.write_text(PROGRAM.replace("@SHAPES@", _c_array(LAYOUT_SHAPES))
                      .replace("@GRID@", _c_array(WIDTH_GRID + OTHER_GRID))
                      .replace("@OPTS@", _c_array(opts))
                      .replace("@CLIPS@", ", ".join(map(_c_float, CLIP_VALUES)))
                      .replace("@CLIP_GRADIENT@", ", ".join(map(_c_float, CLIP_GRADIENT))))
    binary = work / "layout"
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-I", native.get_include(), str(source), "-o", str(binary),
                    "-lm"], check=True)
    out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    return [line.split() for line in out.splitlines()]


def _constants(facts: list[list[str]]) -> dict[str, str]:
    return {row[0]: row[1] for row in facts if len(row) == 2}


def test_constants_match_the_python_side(c_facts: list[list[str]]) -> None:
    c = _constants(c_facts)
    assert int(c["ABI_VERSION"]) == native.ABI_VERSION == abi.ABI_VERSION == 3
    assert int(c["MIN_VOCAB"]) == abi.MIN_VOCAB == 2
    assert int(c["MAX_VOCAB"]) == abi.MAX_VOCAB == 256
    assert int(c["MAX_CONTEXT"]) == abi.MAX_CONTEXT == 256
    assert int(c["MAX_LAYERS"]) == abi.MAX_LAYERS == 12
    assert int(c["MAX_D_MODEL"]) == abi.MAX_D_MODEL == 1024
    assert int(c["D_MODEL_STEP"]) == abi.D_MODEL_STEP == 16
    assert int(c["MAX_BATCH"]) == abi.MAX_NATIVE_BATCH
    # the C constants are float literals printed with 9 digits (enough to round-trip a float32)
    for name, value in (("RMS_EPS", model.RMS_EPS), ("ADAM_BETA1", optim.ADAM_BETA1),
                        ("ADAM_BETA2", optim.ADAM_BETA2), ("ADAM_EPS", optim.ADAM_EPS)):
        assert np.float32(c[name]) == np.float32(value), name


def test_status_codes_native_py_reads_are_the_compiled_ones(c_facts: list[list[str]]) -> None:
    c = _constants(c_facts)
    assert {name: int(c[name]) for name in native.STATUS} == native.STATUS
    assert set(native.STATUS) == {"EMG_OK", "EMG_ERR_ARGUMENT", "EMG_ERR_UNSUPPORTED", "EMG_ERR_NOMEM",
                                  "EMG_ERR_NONFINITE"}


def test_cffi_lays_out_emg_shape_as_the_compiler_does(c_facts: list[list[str]]) -> None:
    row = next(r for r in c_facts if r[0] == "struct")
    ffi = native._ffi()
    fields = ("d_model", "n_heads", "n_layers", "vocab", "context")
    assert [int(x) for x in row[1:]] == [ffi.sizeof("emg_shape"), *(ffi.offsetof("emg_shape", f) for f in fields)]
    shape = ModelShape(48, 4, n_layers=3, vocab=64, context=33)
    struct = native.shape_struct(ffi, shape)
    assert [getattr(struct, f) for f in fields] == [48, 4, 3, 64, 33]


def test_parameter_layout_matches_model_py(c_facts: list[list[str]]) -> None:
    rows = [row for row in c_facts if row[0] == "layout"]
    within = [row for row in c_facts if row[0] == "within"]
    assert [tuple(int(x) for x in row[1:6]) for row in rows] == LAYOUT_SHAPES
    for row, inner in zip(rows, within, strict=True):
        d, h, n_layers, vocab, context = (int(x) for x in row[1:6])
        n_params, tok_emb, pos_emb, wlm, layer_size, layer_size_macro, seq_len = (int(x) for x in row[6:13])
        layer_starts = [int(x) for x in row[13:]]
        shape = ModelShape(d, h, n_layers, vocab, context)
        what = shape.describe()
        off = shape.offsets
        assert (n_params, tok_emb, pos_emb, wlm) == (shape.n_params, off["tok_emb"], off["pos_emb"], off["Wlm"]), what
        assert seq_len == shape.seq_len == context + 1, what
        assert len(layer_starts) == n_layers
        sizes = shape.tensor_shapes
        per_layer = sum(r * c for name, (r, c) in sizes.items() if name.startswith("layers.0."))
        assert layer_size == layer_size_macro == per_layer, what
        offsets_in_layer = dict(zip(LAYER_TENSORS, (int(x) for x in inner[2:]), strict=True))
        for layer, start in enumerate(layer_starts):
            for name in LAYER_TENSORS:
                assert start + offsets_in_layer[name] == off[layer_tensor(layer, name)], (what, layer, name)
        # the documented n_params formula and the sum of the tensor sizes agree too
        assert shape.n_params == sum(r * c for r, c in sizes.values())
        assert shape.n_params == 2 * vocab * d + context * d + 12 * n_layers * d * d


def test_seed_shape_layout_is_version_1s() -> None:
    """With one layer, 27 tokens and context 16 the v2 layout is v1's: tok_emb, pos_emb, Wq..Wf2, Wlm."""
    shape = ModelShape(64)
    d = 64
    assert list(shape.offsets.values()) == [0, 27 * d, 43 * d, 43 * d + d * d, 43 * d + 2 * d * d,
                                            43 * d + 3 * d * d, 43 * d + 4 * d * d, 43 * d + 8 * d * d,
                                            43 * d + 12 * d * d]
    assert shape.n_params == 53_632


def test_shape_rule_matches_model_shape(c_facts: list[list[str]]) -> None:
    checked = 0
    for row in c_facts:
        if row[0] != "valid":
            continue
        d, h, n_layers, vocab, context, c_valid = (int(x) for x in row[1:])
        problem = _problem(d, h, n_layers, vocab, context)
        assert (c_valid == 1) == (problem is None), (d, h, n_layers, vocab, context, problem)
        checked += 1
    assert checked == len(WIDTH_GRID) + len(OTHER_GRID)
    assert _constants(c_facts)["valid_null"] == "0"


def _problem(d: int, h: int, n_layers: int, vocab: int, context: int) -> str | None:
    try:
        ModelShape(d, h, n_layers, vocab, context)
    except model.ShapeError as e:
        return str(e)
    return None


def test_the_header_is_shipped_with_the_core() -> None:
    include = Path(native.get_include())
    assert (include / "eemicrogpt.h").is_file() and (include / "emg_backend.h").is_file()


def test_cffi_lays_out_emg_optimizer_as_the_compiler_does(c_facts: list[list[str]]) -> None:
    row = next(r for r in c_facts if r[0] == "optstruct")
    ffi = native._ffi()
    fields = [f.name for f in dataclasses.fields(optim.OptimizerSettings)]  # named as in C, in C's order
    offsets = [ffi.offsetof("emg_optimizer", f) for f in fields]
    assert [int(x) for x in row[1:]] == [ffi.sizeof("emg_optimizer"), *offsets]


def test_default_optimizer_is_the_python_default(c_facts: list[list[str]]) -> None:
    row = next(r for r in c_facts if r[0] == "optdefault")
    want = dataclasses.astuple(optim.DEFAULT_OPTIMIZER)
    assert [np.float32(x) for x in row[1:]] == [np.float32(v) for v in want]


def test_optimizer_rule_matches_optimizer_settings(c_facts: list[list[str]]) -> None:
    rows = {int(r[1]): int(r[2]) for r in c_facts if r[0] == "optvalid"}
    assert len(rows) == len(OPTIMIZER_GRID)
    for i, opt in enumerate(OPTIMIZER_GRID):
        assert (rows[i] == 1) == (opt.problem() is None), (opt, opt.problem())
    assert sum(rows.values()) == 17  # both sides of every edge: 17 valid settings, 23 not
    assert _constants(c_facts)["optvalid_null"] == "0"


def test_clipping_matches_optim_clip_scale(c_facts: list[list[str]]) -> None:
    rows = {int(r[1]): [np.float32(x) for x in r[2:]] for r in c_facts if r[0] == "clip"}
    grads = np.array(CLIP_GRADIENT, np.float32)
    for i, clip in enumerate(CLIP_VALUES):
        factor = np.float32(optim.clip_scale(grads, clip))
        assert rows[i][0] == factor, clip
        want = grads * factor if factor != 1 else grads
        assert np.array_equal(np.array(rows[i][1:], np.float32), want), clip
    assert [rows[i][0] for i in range(len(CLIP_VALUES))] == [1.0, np.float32(1 / 13), 0.5, 1.0, 1.0]
