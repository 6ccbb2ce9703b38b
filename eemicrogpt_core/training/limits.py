"""A memory estimate of a training run, checked before anything is allocated.

The bounds in config.py stop absurd single values; this stops combinations that fit the bounds but not the
machine (d_model 1024 with batch 4096 and 10,000-step chunks). The estimate is deliberately generous: it
keeps every activation of the whole batch, as numpy_ref does (the x86 backend holds one block of rows per
thread at a time and needs far less), so a run refused here would have swapped or been killed, and one
accepted may still use less. `train` prints it at the start.
"""

from __future__ import annotations

import os

from ..base.abi import MAX_VOCAB
from ..base.errors import ConfigError
from .config import TrainConfig

SAFE_FRACTION = 0.8  # of physical memory


def value_bytes(cfg: TrainConfig) -> int:
    """Bytes of one parameter or activation: the session's dtype (float16 sessions keep float32 masters)."""
    return 8 if cfg.dtype == "float64" else 4


def estimated_bytes(cfg: TrainConfig, vocab: int = MAX_VOCAB) -> int:
    """Checked before the data is read, so the vocabulary defaults to the largest one."""
    shape = cfg.model_shape(vocab)
    seq = shape.seq_len
    size = value_bytes(cfg)
    state = 3 * shape.n_params * size * 4  # session, snapshot, checkpoint and its serialised copy
    per_position = shape.n_layers * (12 * shape.d_model + 3 * shape.d_ff + 3 * shape.n_heads * seq) + 3 * vocab
    activations = 2 * cfg.batch * seq * per_position * size  # forward values kept for backward
    chunk = cfg.chunk_steps * cfg.batch * (seq + 1 + 8)  # tokens, lengths and the int64 sample index
    evaluation = cfg.eval_batches * cfg.batch * (seq + 1)
    losses = 2 * 4 * cfg.steps  # per-step float32 losses, and their concatenation at the end
    return state + activations + chunk + evaluation + losses


def physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None  # not POSIX: no check


def describe_bytes(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.0f} MiB"


def describe_estimate(cfg: TrainConfig, vocab: int, available: int | None = None) -> str:
    """The start-up line: the estimate for this run's vocabulary, against the machine's memory."""
    available = physical_memory() if available is None else available
    has = f"; the machine has {describe_bytes(available)}" if available is not None else ""
    return f"memory: about {describe_bytes(estimated_bytes(cfg, vocab))} at most (estimated{has})"


def check_memory(cfg: TrainConfig, available: int | None = None) -> None:
    available = physical_memory() if available is None else available
    need = estimated_bytes(cfg)
    if available is not None and need > SAFE_FRACTION * available:
        raise ConfigError(
            f"this run needs about {need / 2**30:.1f} GiB (d_model {cfg.d_model}, {cfg.n_layers} layers, context "
            f"{cfg.context}, batch {cfg.batch}, chunk_steps {cfg.chunk_steps}, steps {cfg.steps:,}) but the machine "
            f"has {available / 2**30:.1f} GiB; lower d_model, batch, context, n_layers, chunk_steps or steps"
        )
