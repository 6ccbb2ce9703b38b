"""Checkpoints: everything a run needs to continue exactly, in one atomically written .npz file.

Arrays: params, adam_m, adam_v in the shared parameter layout, kept in the session's float dtype (float32,
or float64 for float64 runs) so that a resume is bit-exact. `meta` holds JSON: the step, the
total steps the LR schedule spans, the batch sampler's generator state, the resolved config, and the recent
train losses (so the rolling mean continues too).
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .atomic import atomic_write_bytes
from .backend import TrainState
from .config import TrainConfig, build_config
from .errors import CheckpointError, ConfigError

FORMAT = "eemicrogpt-checkpoint"
VERSION = 1
_ARRAYS = ("params", "adam_m", "adam_v")


@dataclass
class Checkpoint:
    state: TrainState
    total_steps: int
    sampler_state: dict[str, Any]
    config: TrainConfig
    recent_losses: list[float] = field(default_factory=list)
    backend: str = ""


def _float_array(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    return x if x.dtype in (np.float32, np.float64) else x.astype(np.float32)


def save_checkpoint(path: Path, ckpt: Checkpoint) -> None:
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "step": int(ckpt.state.step),
        "total_steps": int(ckpt.total_steps),
        "sampler_state": ckpt.sampler_state,
        "config": ckpt.config.to_dict(),
        "recent_losses": [float(x) for x in ckpt.recent_losses],
        "backend": ckpt.backend,
    }
    buf = io.BytesIO()
    arrays = {name: _float_array(getattr(ckpt.state, name)) for name in _ARRAYS}
    np.savez(buf, meta=np.array(json.dumps(meta)), **arrays)
    atomic_write_bytes(Path(path), buf.getvalue())


def load_checkpoint(path: Path) -> Checkpoint:
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in ("meta", *_ARRAYS) if k not in npz.files]
            if missing:
                raise CheckpointError(f"{path}: not an eemicrogpt checkpoint (missing {', '.join(missing)})")
            meta = json.loads(str(npz["meta"]))
            arrays = {name: npz[name] for name in _ARRAYS}
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint not found: {path}") from None
    except (OSError, ValueError, zipfile.BadZipFile, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable checkpoint ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not an eemicrogpt checkpoint")
    if meta.get("version") != VERSION:
        raise CheckpointError(f"{path}: checkpoint version {meta.get('version')}, this eemicrogpt reads {VERSION}")
    try:
        config = build_config([(f"{path} (saved config)", meta["config"])])
        step, total = int(meta["step"]), int(meta["total_steps"])
        sampler_state = dict(meta["sampler_state"])
        recent = [float(x) for x in meta.get("recent_losses", [])]
    except ConfigError as e:
        raise CheckpointError(str(e)) from None
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: damaged checkpoint metadata ({e!r})") from None
    n = config.shape.n_params
    for name, array in arrays.items():
        if array.shape != (n,) or array.dtype not in (np.float32, np.float64):
            raise CheckpointError(
                f"{path}: {name} has shape {array.shape} {array.dtype}, expected ({n},) floats for "
                f"d_model {config.d_model}"
            )
    if not 0 <= step <= total:
        raise CheckpointError(f"{path}: step {step} is outside 0..{total}")
    state = TrainState(arrays["params"], arrays["adam_m"], arrays["adam_v"], step)
    return Checkpoint(state, total, sampler_state, config, recent, str(meta.get("backend", "")))
