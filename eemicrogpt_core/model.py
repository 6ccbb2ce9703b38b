"""The model definition: shape, the shared parameter layout (the native ABI's order) and initialisation."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

VOCAB = 27
BOUNDARY = 26  # token that starts and ends every name
MAX_SEQ = 16
RMS_EPS = 1e-5
INIT_STD = 0.08

# Attention heads per model width, decided here only: the presets, `bench` and the benchmarks read it
# (8 at d128, as the seed's example run; 4 elsewhere and for widths not listed).
DEFAULT_HEADS = 4
HEADS_BY_D_MODEL = {16: 4, 32: 4, 64: 4, 128: 8}

# Tensor order in the flat parameter buffer. Native backends depend on it: never reorder.
TENSOR_NAMES = ("tok_emb", "pos_emb", "Wq", "Wk", "Wv", "Wo", "Wf1", "Wf2", "Wlm")


def default_heads(d_model: int) -> int:
    return HEADS_BY_D_MODEL.get(d_model, DEFAULT_HEADS)


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

    def __post_init__(self) -> None:
        for key in ("d_model", "n_heads"):
            if getattr(self, key) < 1:
                raise ShapeError(key, f"must be >= 1, got {getattr(self, key)}")
        if self.d_model % self.n_heads:
            raise ShapeError("n_heads", f"must divide d_model {self.d_model}, got {self.n_heads}")
        if self.head_dim < 4:
            raise ShapeError("n_heads", f"leaves head_dim {self.head_dim} (d_model / n_heads must be >= 4)")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def d_ff(self) -> int:
        return 4 * self.d_model

    @cached_property
    def tensor_shapes(self) -> dict[str, tuple[int, int]]:
        d, f = self.d_model, self.d_ff
        return {
            "tok_emb": (VOCAB, d),
            "pos_emb": (MAX_SEQ, d),
            "Wq": (d, d),
            "Wk": (d, d),
            "Wv": (d, d),
            "Wo": (d, d),
            "Wf1": (f, d),
            "Wf2": (d, f),
            "Wlm": (VOCAB, d),
        }

    @cached_property
    def offsets(self) -> dict[str, int]:
        out, pos = {}, 0
        for name in TENSOR_NAMES:
            out[name] = pos
            rows, cols = self.tensor_shapes[name]
            pos += rows * cols
        return out

    @property
    def n_params(self) -> int:
        return 2 * VOCAB * self.d_model + MAX_SEQ * self.d_model + 12 * self.d_model * self.d_model


def views(shape: ModelShape, flat: np.ndarray) -> dict[str, np.ndarray]:
    """Named 2-D views (no copies) into a flat buffer laid out in TENSOR_NAMES order."""
    if flat.ndim != 1 or flat.size != shape.n_params:
        raise ValueError(f"expected a flat buffer of {shape.n_params} values, got shape {flat.shape}")
    out = {}
    for name in TENSOR_NAMES:
        rows, cols = shape.tensor_shapes[name]
        start = shape.offsets[name]
        out[name] = flat[start : start + rows * cols].reshape(rows, cols)
    return out


def init_params(shape: ModelShape, seed: int) -> np.ndarray:
    """N(0, INIT_STD) for every tensor, drawn from one seeded generator in layout order."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape.n_params) * INIT_STD).astype(np.float32)
