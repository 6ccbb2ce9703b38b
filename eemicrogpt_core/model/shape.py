"""The model definition: shape, the shared parameter layout (the native ABI's order) and initialisation.

A model is {d_model, n_heads, n_layers, vocab, context}: microgpt's loop, one embedding norm, then per layer
a pre-norm attention block and a pre-norm ReLU MLP block, each with its residual, and the LM head on the
last residual. `vocab` counts the data's symbols plus the boundary token (the last token, vocab - 1);
`context` is the number of predictions per sequence (a sequence holds up to context + 1 tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..base.abi import MAX_CONTEXT, MAX_D_MODEL, MAX_LAYERS, MAX_VOCAB, MIN_VOCAB

RMS_EPS = 1e-5
# Initialisation (init_stds). Up to INIT_WIDTH every tensor is N(0, INIT_STD), microgpt's init, unchanged: the shipped
# configs and every measured result use those shapes. Wider, the matrices' std shrinks as 1/sqrt(d_model), so a
# matrix's gain (fan-in x std^2) stays at its d128 value instead of growing with the width, and the residual
# projections (Wo, Wf2) are divided by sqrt(2 n_layers) as GPT-2's are, so the residual (there is no final norm)
# and the logits do not grow with depth. Measured on tiny Shakespeare (ln 65 = 4.17): the initial loss was 19-62
# at d256-d1024 (32 at d384/6 layers, still 15.4 after 120 steps at lr 0.002) with 0.08 everywhere, and is 4.8-5.0
# with this rule, 2.5-3.2 after those steps (docs/benchmarks.md, "Initialisation at wide widths").
INIT_STD = 0.08
INIT_WIDTH = 128
RESIDUAL_PROJECTIONS = ("Wo", "Wf2")
DEFAULT_CONTEXT = 16  # microgpt's block_size
NAMES_VOCAB = 27  # a-z plus the boundary: the makemore names' vocabulary

# Attention heads per model width, decided here only: the presets, `bench` and the benchmarks read it
# (8 at d128, as the seed's example run; 4 elsewhere and for widths not listed).
DEFAULT_HEADS = 4
HEADS_BY_D_MODEL = {16: 4, 32: 4, 64: 4, 128: 8}

# Tensor order in the flat parameter buffer. Native backends depend on it: never reorder.
EMBEDDING_TENSORS = ("tok_emb", "pos_emb")
LAYER_TENSORS = ("Wq", "Wk", "Wv", "Wo", "Wf1", "Wf2")
HEAD_TENSORS = ("Wlm",)


def default_heads(d_model: int) -> int:
    return HEADS_BY_D_MODEL.get(d_model, DEFAULT_HEADS)


def layer_tensor(layer: int, name: str) -> str:
    """The flat-buffer name of one layer's tensor, e.g. layers.0.Wq."""
    return f"layers.{layer}.{name}"


class ShapeError(ValueError):
    """An impossible model shape: `key` names the ModelShape field at fault (a config key of the same name),
    `problem` says what is wrong ("must divide d_model 30, got 4")."""

    def __init__(self, key: str, problem: str) -> None:
        self.key, self.problem = key, problem
        super().__init__(f"{key} {problem}")


@dataclass(frozen=True)
class ModelShape:
    d_model: int
    n_heads: int = DEFAULT_HEADS
    n_layers: int = 1
    vocab: int = NAMES_VOCAB
    context: int = DEFAULT_CONTEXT

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem is not None:
            raise ShapeError(*problem)

    def problem(self) -> tuple[str, str] | None:
        """The field at fault and why this shape is impossible (the rules emg_shape_valid checks in C), or None."""
        for key in ("d_model", "n_heads"):
            if getattr(self, key) < 1:
                return key, f"must be >= 1, got {getattr(self, key)}"
        if self.d_model > MAX_D_MODEL:
            return "d_model", f"must be at most {MAX_D_MODEL}, got {self.d_model}"
        if self.d_model % self.n_heads:
            return "n_heads", f"must divide d_model {self.d_model}, got {self.n_heads}"
        if self.d_model // self.n_heads < 4:
            return "n_heads", f"leaves head_dim {self.d_model // self.n_heads} (d_model / n_heads must be >= 4)"
        if not 1 <= self.n_layers <= MAX_LAYERS:
            return "n_layers", f"must be 1..{MAX_LAYERS}, got {self.n_layers}"
        if not MIN_VOCAB <= self.vocab <= MAX_VOCAB:
            return "vocab", f"must be {MIN_VOCAB}..{MAX_VOCAB} tokens, got {self.vocab}"
        if not 1 <= self.context <= MAX_CONTEXT:
            return "context", f"must be 1..{MAX_CONTEXT}, got {self.context}"
        return None

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def d_ff(self) -> int:
        return 4 * self.d_model

    @property
    def boundary(self) -> int:
        """The token that starts and ends every sequence: the last one."""
        return self.vocab - 1

    @property
    def seq_len(self) -> int:
        """Tokens per sequence row of a batch: the boundary plus `context` more."""
        return self.context + 1

    @cached_property
    def tensor_shapes(self) -> dict[str, tuple[int, int]]:
        """Every tensor's [rows, cols] in layout order: tok_emb, pos_emb, layers.L.* per layer, Wlm."""
        d, f = self.d_model, self.d_ff
        per_layer = {"Wq": (d, d), "Wk": (d, d), "Wv": (d, d), "Wo": (d, d), "Wf1": (f, d), "Wf2": (d, f)}
        out = {"tok_emb": (self.vocab, d), "pos_emb": (self.context, d)}
        for layer in range(self.n_layers):
            out.update({layer_tensor(layer, name): per_layer[name] for name in LAYER_TENSORS})
        out["Wlm"] = (self.vocab, d)
        return out

    @property
    def tensor_names(self) -> tuple[str, ...]:
        return tuple(self.tensor_shapes)

    @cached_property
    def offsets(self) -> dict[str, int]:
        out, pos = {}, 0
        for name, (rows, cols) in self.tensor_shapes.items():
            out[name] = pos
            pos += rows * cols
        return out

    @cached_property
    def n_params(self) -> int:
        """The flat buffer's length: the sum over the layout, so it cannot disagree with it."""
        return sum(rows * cols for rows, cols in self.tensor_shapes.values())

    def describe(self) -> str:
        """e.g. 'd64, 4 heads, 2 layers, vocab 27, context 16'."""
        layers = "1 layer" if self.n_layers == 1 else f"{self.n_layers} layers"
        return f"d{self.d_model}, {self.n_heads} heads, {layers}, vocab {self.vocab}, context {self.context}"


def views(shape: ModelShape, flat: np.ndarray) -> dict[str, np.ndarray]:
    """Named 2-D views (no copies) into a flat buffer laid out in the shape's tensor order."""
    if flat.ndim != 1 or flat.size != shape.n_params:
        raise ValueError(f"expected a flat buffer of {shape.n_params} values, got shape {flat.shape}")
    out = {}
    for name, (rows, cols) in shape.tensor_shapes.items():
        start = shape.offsets[name]
        out[name] = flat[start : start + rows * cols].reshape(rows, cols)
    return out


def init_stds(shape: ModelShape) -> dict[str, float]:
    """Each tensor's initial standard deviation (the rule above INIT_STD)."""
    if shape.d_model <= INIT_WIDTH:
        return dict.fromkeys(shape.tensor_names, INIT_STD)
    matrix = INIT_STD * math.sqrt(INIT_WIDTH / shape.d_model)
    residual = matrix / math.sqrt(2 * shape.n_layers)
    out = dict.fromkeys(EMBEDDING_TENSORS, INIT_STD)  # they feed a norm: their scale does not reach the residual
    for name in shape.tensor_names[len(EMBEDDING_TENSORS):]:
        out[name] = residual if name.rsplit(".", 1)[-1] in RESIDUAL_PROJECTIONS else matrix
    return out


def init_params(shape: ModelShape, seed: int) -> np.ndarray:
    """N(0, init_stds) per tensor: one seeded generator's standard normals in layout order, each tensor's scaled."""
    flat = np.random.default_rng(seed).standard_normal(shape.n_params)
    for name, std in init_stds(shape).items():
        rows, cols = shape.tensor_shapes[name]
        flat[shape.offsets[name] : shape.offsets[name] + rows * cols] *= std
    return flat.astype(np.float32)
