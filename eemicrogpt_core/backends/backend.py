"""What a backend is: its descriptor, its probe result, its session, and the training state it holds.

A plugin's hook yields BackendSpec descriptors and does no work; the registry probes and instantiates them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from ..base.abi import MAX_NATIVE_BATCH
from ..model.optim import OptimizerSettings
from ..model.shape import ModelShape
from .precision import FP32


@dataclass(frozen=True)
class ProbeResult:
    available: bool
    reason: str = ""  # why it is unavailable (or a note on what was detected)
    score: int = 0  # higher wins in `auto`; 0 means never picked automatically

    @classmethod
    def ok(cls, score: int, note: str = "") -> ProbeResult:
        return cls(True, note, score)

    @classmethod
    def no(cls, reason: str) -> ProbeResult:
        return cls(False, reason, 0)


@dataclass
class TrainState:
    """Everything a step depends on: parameters, Adam moments and the number of updates done."""

    params: np.ndarray
    adam_m: np.ndarray
    adam_v: np.ndarray
    step: int = 0

    @classmethod
    def fresh(cls, params: np.ndarray) -> TrainState:
        return cls(params.copy(), np.zeros_like(params), np.zeros_like(params), 0)

    def copy(self) -> TrainState:
        return TrainState(self.params.copy(), self.adam_m.copy(), self.adam_v.copy(), self.step)


# The names of TrainState's arrays, in field order: checks, checkpoints and the kits loop over these.
STATE_ARRAYS = ("params", "adam_m", "adam_v")


@runtime_checkable
class BackendSession(Protocol):
    """A live backend instance for one model shape. Inputs arrive already validated by the core.

    Optional (a protocol cannot mark one method optional): a session that can split a step across threads also
    has `set_threads(n) -> int` (ThreadedSession below; without it a session runs on one thread), and one that
    runs AdamW's settings has `set_optimizer(opt)` (OptimizerSession below; without it a session runs only the
    default optimiser, and the trainer refuses other settings before a run starts).
    """

    def set_state(self, state: TrainState) -> None: ...

    def get_state(self) -> TrainState: ...

    def train_steps(self, tokens: np.ndarray, lengths: np.ndarray, lrs: np.ndarray) -> np.ndarray:
        """tokens uint8 [n, B, MAX_SEQ], lengths uint16 [n, B], lrs float32 [n] -> losses float32 [n]."""
        ...

    def loss_and_grads(
        self, tokens: np.ndarray, lengths: np.ndarray, want_grads: bool = True
    ) -> tuple[float, np.ndarray | None]:
        """tokens uint8 [B, MAX_SEQ], lengths uint16 [B] -> (mean loss, flat gradient or None)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class ThreadedSession(Protocol):
    """The optional part of BackendSession: splitting each step across threads."""

    def set_threads(self, n: int) -> int:
        """Run each step on n threads; returns the count in use. The same n gives bit-identical results (any n
        does, for a backend that declares BackendSpec.thread_independent)."""
        ...


@runtime_checkable
class OptimizerSession(Protocol):
    """The optional part of BackendSession: the optimiser's settings (betas, eps, weight decay, clipping)."""

    def set_optimizer(self, opt: OptimizerSettings) -> None:
        """Apply `opt` (already checked: opt.problem() is None) to every later train_steps update, in the order
        of optim.adam_update; the state is not changed. A session starts with optim.DEFAULT_OPTIMIZER, and the
        trainer calls this only for other settings."""
        ...


SessionFactory = Callable[[ModelShape, int, str], BackendSession]  # (shape, max_batch, dtype)


@dataclass(frozen=True)
class BackendSpec:
    """A backend as a plugin declares it; nothing here runs until the registry asks."""

    name: str
    description: str
    probe: Callable[[], ProbeResult]
    factory: SessionFactory
    d_models: tuple[int, ...] | None = None  # None: any shape ModelShape accepts
    n_heads: tuple[int, ...] | None = None  # None: any
    # Asked after d_models/n_heads, only for an available backend: native backends pass
    # native.library_supports(...), so their shapes are declared once, by the kernels in C.
    supports: Callable[[ModelShape], bool] | None = field(default=None, compare=False, hash=False)
    dtypes: tuple[str, ...] = ("float32",)
    max_batch: int = MAX_NATIVE_BATCH  # a Python backend may declare more, up to config.MAX_CONFIG_BATCH
    precision: str = FP32  # what the matrix products compute in (precision.PRECISIONS); `auto` asks for fp32
    extra: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    # The shapes it runs, in words for `eemicrogpt backends` (e.g. "d16-256 step 16, 1-8 layers, ..."); the
    # authority is still `supports`.
    envelope: str = ""
    # Its sessions give bit-identical results whatever their thread count, so `threads: auto` may change the
    # count between any two calls (the conformance kit checks it when set).
    thread_independent: bool = False
    # Packed positions whose activations one thread keeps at a time, when the backend runs a batch block by
    # block (a block grows to one whole sequence when the context is longer); None: it keeps every position of
    # the batch, as numpy_ref does. Only the memory estimate reads it (training/limits.py).
    block_rows: int | None = None
    # Bytes of activations up to which one thread's block may hold more than block_rows positions (x86: its
    # widest models' blocks); 0: never. Only the memory estimate reads it.
    block_bytes: int = 0

    def unsupported_reason(self, shape: ModelShape, batch: int, dtype: str = "float32") -> str | None:
        """None when this backend can run the shape, otherwise a sentence saying why not."""
        if self.d_models is not None and shape.d_model not in self.d_models:
            sizes = ", ".join(map(str, self.d_models))
            return f"{self.name} supports d_model {sizes}, not {shape.d_model}"
        if self.n_heads is not None and shape.n_heads not in self.n_heads:
            heads = ", ".join(map(str, self.n_heads))
            return f"{self.name} supports n_heads {heads}, not {shape.n_heads}"
        if self.supports is not None and not self.supports(shape):
            return f"{self.name} has no kernel for {shape.describe()}"
        if dtype not in self.dtypes:
            return f"{self.name} supports dtype {', '.join(self.dtypes)}, not {dtype}"
        if not 1 <= batch <= self.max_batch:
            return f"{self.name} supports batch 1..{self.max_batch}, not {batch}"
        return None
