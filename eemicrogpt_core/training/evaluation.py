"""A trained run's loss on a whole file (`eemicrogpt eval`, Run.eval): the validation line's routine on every
name of a list, or on consecutive windows covering every character of a text."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..backends.registry import BackendRegistry, open_session
from ..backends.session_checks import CheckedSession
from ..base.errors import DataError
from ..data.names import encode, read_names
from ..data.text import consecutive_offsets, read_text, windows_in_batches
from ..model.vocab import Vocabulary
from .checkpoint import Checkpoint
from .config import TrainConfig, resolve_backend
from .trainer import evaluate

Batches = list[tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class FileLoss:
    """Mean cross-entropy per predicted token over a file."""

    loss: float  # nats
    predictions: int  # tokens predicted (a text: its characters but the first; a list: its names' characters
    # plus each name's end)
    items: int  # characters of a text, names of a list
    unit: str  # "characters" or "names"
    backend: str

    @property
    def bits(self) -> float:
        """Bits per predicted token (per character for a text)."""
        return self.loss / math.log(2)


def file_batches(path: str | Path, cfg: TrainConfig, vocab: Vocabulary) -> tuple[Batches, int, str]:
    """The whole file as batches of cfg.batch rows in the run's format and vocabulary, with its item count."""
    if cfg.data_format == "text":
        tokens = read_text(path, lowercase=cfg.lowercase, vocab=vocab).tokens
        if tokens.size < 2:
            raise DataError(f"{path}: one character has nothing after it to predict; give a longer text")
        offsets = consecutive_offsets(tokens.size, cfg.context)
        return windows_in_batches(tokens, offsets, cfg.context, cfg.batch), int(tokens.size), "characters"
    names = read_names(path, drop_invalid=cfg.drop_invalid, lowercase=cfg.lowercase, vocab=vocab)
    data, _ = encode(names.names, vocab, cfg.context)
    return data.all_batches(cfg.batch), len(data), "names"


def evaluate_file(registry: BackendRegistry, ckpt: Checkpoint, path: str | Path, backend: str | None = None,
                  on_batch: Callable[[int, int], None] | None = None) -> FileLoss:
    """The checkpoint's mean loss over every prediction the file holds, on `backend` (> $EEMICROGPT_BACKEND > the
    run's own); the file is read (and refused) before a backend session opens. on_batch(done, total) after each
    batch: tiny Shakespeare at nanoGPT's full shape took about 90 s on two x86 cores."""
    cfg = ckpt.config
    batches, items, unit = file_batches(path, cfg, ckpt.vocab)
    entry = registry.select(resolve_backend(backend, cfg.backend), ckpt.shape, cfg.batch, cfg.dtype, cfg.precision)
    with open_session(entry, ckpt.shape, cfg.batch, cfg.dtype, cfg.threads) as opened:
        session = CheckedSession(opened, ckpt.shape, cfg.dtype, entry.name)
        session.set_state(ckpt.state)
        loss = evaluate(session, batches, on_batch)
    predictions = sum(int(np.sum(lengths.astype(np.int64) - 1)) for _, lengths in batches)
    assert loss is not None  # a file always gives at least one batch
    return FileLoss(loss, predictions, items, unit, entry.name)
