"""Checkpoint files edited by hand, shared by the tests: the format-2 layout (pytest puts tests/ on sys.path)."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from eemicrogpt_core.model.shape import ModelShape
from eemicrogpt_core.model.vocab import Vocabulary
from eemicrogpt_core.training.checkpoint import Checkpoint, load_checkpoint

LEGACY_KEYS = ("n_layers", "context", "lowercase")  # config keys that format 2 did not have


def read_meta(path: Path) -> dict[str, Any]:
    with zipfile.ZipFile(path) as zf:
        return json.loads(str(np.load(io.BytesIO(zf.read("meta.npy")))))


def write_members(path: Path, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    buf = io.BytesIO()
    np.savez(buf, meta=np.array(json.dumps(meta)), **arrays)
    path.write_bytes(buf.getvalue())


def write_format_2(path: Path, ckpt: Checkpoint) -> None:
    """`ckpt` (a-z, one layer, context 15) in the format-2 layout: meta version 2 with no symbols and a config
    without the keys format 3 added, and 16 pos_emb rows: the 16th (position 15) was never trained, so its
    parameters hold their initial values and its Adam moments are zero."""
    shape = ckpt.shape
    assert ckpt.vocab == Vocabulary.names() and shape.n_layers == 1 and shape.context == 15
    meta: dict[str, Any] = {
        "format": "eemicrogpt-checkpoint", "version": 2, "step": ckpt.state.step, "total_steps": ckpt.total_steps,
        "sampler_state": ckpt.sampler_state, "recent_losses": ckpt.recent_losses, "backend": ckpt.backend,
        "data_sha256": ckpt.data_sha256, "versions": {"eemicrogpt": "0.1.0"},
        "config": {k: v for k, v in ckpt.config.to_dict().items() if k not in LEGACY_KEYS},
    }
    row = shape.offsets["pos_emb"] + 15 * shape.d_model
    untrained = np.random.default_rng(99).normal(0, 0.08, shape.d_model)
    fills = {"params": untrained, "adam_m": np.zeros(shape.d_model), "adam_v": np.zeros(shape.d_model)}
    arrays = {name: np.insert(getattr(ckpt.state, name), row, fills[name].astype(getattr(ckpt.state, name).dtype))
              for name in fills}
    assert arrays["params"].size == ModelShape(shape.d_model, shape.n_heads, context=16).n_params
    write_members(path, meta, arrays)


def rewrite_run_as_format_2(run_dir: Path) -> None:
    """A run directory as an older eemicrogpt left it: its checkpoint in format 2, config.yaml without the
    keys format 3 added."""
    path = run_dir / "checkpoint.npz"
    write_format_2(path, load_checkpoint(path))
    config = run_dir / "config.yaml"
    kept = [line for line in config.read_text().splitlines() if line.split(":")[0] not in LEGACY_KEYS]
    config.write_text("\n".join(kept) + "\n")
