"""A memory estimate of a training run, checked before anything is allocated.

The bounds in config.py stop absurd single values; this stops combinations that fit the bounds but not the
machine (d_model 1024 with batch 4096 and 10,000-step chunks). The estimate is deliberately generous: a
run refused here would have swapped or been killed, and one accepted may still use less.
"""

from __future__ import annotations

import os

from ..base.abi import MAX_VOCAB
from ..base.errors import ConfigError
from .config import TrainConfig

FLOAT_BYTES = 8  # float64 runs (and numpy_ref's float64 maths) are the worst case
SAFE_FRACTION = 0.8  # of physical memory


def estimated_bytes(cfg: TrainConfig, vocab: int = MAX_VOCAB) -> int:
    """Checked before the data is read, so the vocabulary defaults to the largest one."""
    shape = cfg.model_shape(vocab)
    seq = shape.seq_len
    state = 3 * shape.n_params * FLOAT_BYTES * 4  # session, snapshot, checkpoint and its serialised copy
    per_position = shape.n_layers * (12 * shape.d_model + 3 * shape.d_ff + 3 * shape.n_heads * seq) + 3 * vocab
    activations = 2 * cfg.batch * seq * per_position * FLOAT_BYTES  # forward values kept for backward
    chunk = cfg.chunk_steps * cfg.batch * (seq + 1 + 8)  # tokens, lengths and the int64 sample index
    evaluation = cfg.eval_batches * cfg.batch * (seq + 1)
    losses = 2 * 4 * cfg.steps  # per-step float32 losses, and their concatenation at the end
    return state + activations + chunk + evaluation + losses


def physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None  # not POSIX: no check


def check_memory(cfg: TrainConfig, available: int | None = None) -> None:
    available = physical_memory() if available is None else available
    need = estimated_bytes(cfg)
    if available is not None and need > SAFE_FRACTION * available:
        raise ConfigError(
            f"this run needs about {need / 2**30:.1f} GiB (d_model {cfg.d_model}, batch {cfg.batch}, "
            f"chunk_steps {cfg.chunk_steps}, steps {cfg.steps:,}) but the machine has {available / 2**30:.1f} GiB; "
            "lower d_model, batch, chunk_steps or steps"
        )
