"""Export a trained model for use elsewhere: safetensors (tensors by name), a PyTorch file or an ONNX graph.

safetensors: every tensor under its layout name (tok_emb, pos_emb, layers.0.Wq, ..., Wlm), float32, row-major
W[out][in]; the metadata holds "eemicrogpt.shape" and "eemicrogpt.config" (JSON) and "eemicrogpt.symbols"
(a JSON list: token i is symbols[i]; for a list run the boundary is the last token, len(symbols), and a text
run, data_format text in the config, has none). torch: torch.save of
{"state_dict", "shape", "symbols"}; eemicrogpt_core.tools.torch_model.load_export rebuilds the module from it.
onnx: the forward pass as an ONNX graph with the same metadata (onnx_model.py), for onnxruntime and friends.

Files are created new (O_EXCL): an existing file is never replaced.
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from ..base.atomic import atomic_create_bytes
from ..base.errors import ConfigError, StorageError, describe_os_error
from ..model.shape import ModelShape, views

FORMATS = ("safetensors", "torch", "onnx")
METADATA_PREFIX = "eemicrogpt."


def tensors_by_name(params: np.ndarray, shape: ModelShape) -> dict[str, np.ndarray]:
    return {name: np.ascontiguousarray(view, dtype=np.float32) for name, view in views(shape, params).items()}


def safetensors_bytes(params: np.ndarray, shape: ModelShape, symbols: tuple[str, ...],
                      config: dict[str, Any]) -> bytes:
    try:
        from safetensors.numpy import save
    except ImportError:
        raise ConfigError("--format safetensors needs the safetensors package: pip install safetensors "
                          "(or the eemicrogpt[export] extra)") from None
    metadata = {
        f"{METADATA_PREFIX}shape": json.dumps(dataclasses.asdict(shape)),
        f"{METADATA_PREFIX}symbols": json.dumps(list(symbols), ensure_ascii=False),
        f"{METADATA_PREFIX}config": json.dumps(config),
    }
    return save(tensors_by_name(params, shape), metadata=metadata)


def torch_bytes(params: np.ndarray, shape: ModelShape, symbols: tuple[str, ...]) -> bytes:
    from .torch_model import EXPORT_KEYS, import_torch

    torch = import_torch()
    state = {name: torch.from_numpy(t.copy()) for name, t in tensors_by_name(params, shape).items()}
    buf = io.BytesIO()
    torch.save(dict(zip(EXPORT_KEYS, (state, dataclasses.asdict(shape), list(symbols)), strict=True)), buf)
    return buf.getvalue()


def write_new_file(path: Path, data: bytes) -> None:
    """Create path with data, atomically (a full disk leaves no partial file); an existing path is refused,
    never replaced, and a link there is never followed."""
    try:
        atomic_create_bytes(path, data)
    except FileExistsError:
        raise ConfigError(f"{path} already exists; choose a new file (an export never replaces one)") from None
    except OSError as e:
        raise StorageError(describe_os_error(e, "cannot write the export")) from None


def export_run(run: Any, path: Path, format: str) -> Path:
    """run: anything with params, shape, vocab and config (eemicrogpt.Run)."""
    if format not in FORMATS:
        raise ConfigError(f"export format must be one of {', '.join(FORMATS)}, got {format!r}")
    symbols = run.vocab.symbols
    if format == "safetensors":
        data = safetensors_bytes(run.params, run.shape, symbols, run.config.to_dict())
    elif format == "onnx":
        from .onnx_model import onnx_bytes

        data = onnx_bytes(run.params, run.shape, symbols, run.config.to_dict())
    else:
        data = torch_bytes(run.params, run.shape, symbols)
    write_new_file(path, data)
    return path
