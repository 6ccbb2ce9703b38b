"""A memory estimate of a training run, checked before anything is allocated.

The bounds in config.py stop absurd single values; this stops combinations that fit the bounds but not the
machine (d_model 1024 with batch 4096 and 10,000-step chunks). The estimate is deliberately generous where it
must guess: a backend that runs a batch block by block (BackendSpec.block_rows: x86 holds one block of rows
per thread, grown up to BackendSpec.block_bytes of activations for its widest models) is counted with one
block per thread, every thread the machine has unless `threads` is set; any other keeps every activation of
the whole batch, as numpy_ref does. Before a backend is chosen, only what every backend needs at least (one
sequence per thread) is checked. `train` prints the chosen backend's figure at the start. Measured:
nanoGPT's full shape (d384, 6 layers, context 256, batch 64) on x86 (avx512) with 2 threads peaked at 1,013
MiB resident (blocks of three sequences); the estimate says 1,137 MiB (10.7 GiB for the whole batch).
"""

from __future__ import annotations

import os

from ..base.abi import MAX_VOCAB
from ..base.errors import ConfigError
from .config import TrainConfig

SAFE_FRACTION = 0.8  # of physical memory
WHOLE_BATCH = None  # block_rows of a backend that keeps every activation of the batch
LEAST_ROWS = 1  # block_rows before a backend is chosen: no backend holds less than one sequence per thread


def value_bytes(cfg: TrainConfig) -> int:
    """Bytes of one parameter or activation: the session's dtype (float16 sessions keep float32 masters)."""
    return 8 if cfg.dtype == "float64" else 4


def activation_bytes(cfg: TrainConfig, seq: int, per_position: int, block_rows: int | None,
                     block_bytes: int = 0) -> int:
    """Bytes of the activations a session keeps at once: the whole batch's, or one block per thread (of
    block_rows positions, or up to block_bytes), each counted twice over (generous: the forward values kept
    for the backward pass and the backward's own buffers)."""
    per_row = per_position * value_bytes(cfg)
    whole = cfg.batch * seq * per_row
    if block_rows is None:
        return 2 * whole
    threads = cfg.threads or os.cpu_count() or 1
    return 2 * min(whole, threads * max(max(block_rows, seq) * per_row, block_bytes))


def estimated_bytes(cfg: TrainConfig, vocab: int = MAX_VOCAB, block_rows: int | None = WHOLE_BATCH,
                    block_bytes: int = 0) -> int:
    """Checked before the data is read, so the vocabulary defaults to the largest one."""
    shape = cfg.model_shape(vocab)
    seq = shape.seq_len
    size = value_bytes(cfg)
    state = 3 * shape.n_params * size * 4  # session, snapshot, checkpoint and its serialised copy
    per_position = shape.n_layers * (12 * shape.d_model + 3 * shape.d_ff + 3 * shape.n_heads * seq) + 3 * vocab
    activations = activation_bytes(cfg, seq, per_position, block_rows, block_bytes)
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


def describe_estimate(cfg: TrainConfig, vocab: int, available: int | None = None,
                      block_rows: int | None = WHOLE_BATCH, block_bytes: int = 0) -> str:
    """The start-up line: the estimate for this run's vocabulary and backend, against the machine's memory."""
    available = physical_memory() if available is None else available
    has = f"; the machine has {describe_bytes(available)}" if available is not None else ""
    need = estimated_bytes(cfg, vocab, block_rows, block_bytes)
    return f"memory: about {describe_bytes(need)} at most (estimated{has})"


def check_memory(cfg: TrainConfig, available: int | None = None, block_rows: int | None = WHOLE_BATCH,
                 vocab: int = MAX_VOCAB, block_bytes: int = 0) -> None:
    available = physical_memory() if available is None else available
    need = estimated_bytes(cfg, vocab, block_rows, block_bytes)
    if available is not None and need > SAFE_FRACTION * available:
        raise ConfigError(
            f"this run needs about {need / 2**30:.1f} GiB (d_model {cfg.d_model}, {cfg.n_layers} layers, context "
            f"{cfg.context}, batch {cfg.batch}, chunk_steps {cfg.chunk_steps}, steps {cfg.steps:,}) but the machine "
            f"has {available / 2**30:.1f} GiB; lower d_model, batch, context, n_layers, chunk_steps or steps"
        )
