"""The model as a PyTorch nn.Module (optional: needs torch), for using an exported run elsewhere.

The same maths as reference.py in torch ops: x = rms(tok_emb[t] + pos_emb[pos]); per layer a pre-norm causal
attention block and a pre-norm ReLU MLP block with residuals; logits = x Wlm^T. No biases, no norm gains.
The module's state dict keys are the layout names (tok_emb, pos_emb, layers.0.Wq, ..., Wlm), so the state
dict that `eemicrogpt export --format torch` writes loads into `build_module(shape)` as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..base.errors import CheckpointError, ConfigError, DataError, StorageError, describe_os_error
from ..model.shape import LAYER_TENSORS, RMS_EPS, ModelShape, views
from ..model.vocab import Vocabulary

# The keys of the dict in a `--format torch` file (export.py writes it, load_export reads it).
EXPORT_KEYS = ("state_dict", "shape", "symbols")


def import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ConfigError("this needs PyTorch: pip install torch") from None
    return torch


def build_module(shape: ModelShape) -> Any:
    """An nn.Module of this shape with zero weights; module(tokens [B, T] int64) -> logits [B, T, vocab]."""
    torch = import_torch()
    nn = torch.nn

    def zeros(name: str, layer_shapes: dict[str, tuple[int, int]]) -> Any:
        return nn.Parameter(torch.zeros(layer_shapes[name], dtype=torch.float32))

    shapes = shape.tensor_shapes
    layer0 = {name: shapes[f"layers.0.{name}"] for name in LAYER_TENSORS}

    class Layer(nn.Module):  # type: ignore[name-defined]  # torch is imported at call time
        def __init__(self) -> None:
            super().__init__()
            for name in LAYER_TENSORS:
                self.register_parameter(name, zeros(name, layer0))

    class MicroGPT(nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.shape = shape
            for name in ("tok_emb", "pos_emb", "Wlm"):
                self.register_parameter(name, zeros(name, shapes))
            self.layers = nn.ModuleList(Layer() for _ in range(shape.n_layers))
            mask = torch.ones(shape.context, shape.context, dtype=torch.bool).tril()
            self.register_buffer("causal", mask, persistent=False)

        @staticmethod
        def rms(x: Any) -> Any:
            return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + RMS_EPS)

        def forward(self, tokens: Any) -> Any:
            b, t = tokens.shape
            if not 1 <= t <= shape.context:
                raise ValueError(f"sequence length must be 1..{shape.context} (the context), got {t}")
            h, hd = shape.n_heads, shape.head_dim
            pos = torch.arange(t, device=tokens.device)
            x = self.rms(self.tok_emb[tokens] + self.pos_emb[pos])
            for w in self.layers:
                n1 = self.rms(x)
                q, k, v = ((n1 @ m.T).view(b, t, h, hd).transpose(1, 2) for m in (w.Wq, w.Wk, w.Wv))
                scores = (q @ k.transpose(-1, -2)) / hd**0.5
                scores = scores.masked_fill(~self.causal[:t, :t], float("-inf"))
                att = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, t, shape.d_model)
                x = x + att @ w.Wo.T
                x = x + torch.relu(self.rms(x) @ w.Wf1.T) @ w.Wf2.T
            return x @ self.Wlm.T

    return MicroGPT()


def to_torch(params: np.ndarray, shape: ModelShape) -> Any:
    """build_module(shape) holding these parameters (copied: the module does not alias `params`)."""
    torch = import_torch()
    module = build_module(shape)
    module.load_state_dict({name: torch.from_numpy(np.array(t, dtype=np.float32))
                            for name, t in views(shape, params).items()})
    return module


def load_export(path: str | Path) -> tuple[Any, Vocabulary]:
    """The module and the vocabulary of a `--format torch` file."""
    torch = import_torch()
    try:
        # weights_only: tensors, dicts, lists and numbers only; a file that would run code is refused.
        payload = torch.load(str(path), map_location="cpu", weights_only=True)
    except OSError as e:
        raise StorageError(describe_os_error(e, "cannot read the torch export")) from None
    except Exception as e:  # torch raises RuntimeError, pickle's and zipfile's errors for a foreign file
        raise CheckpointError(f"{path} is not a torch file eemicrogpt can read: {e}") from None
    if not isinstance(payload, dict) or set(payload) != set(EXPORT_KEYS):
        raise CheckpointError(f"{path} is not an eemicrogpt torch export (expected the keys {', '.join(EXPORT_KEYS)})")
    try:
        shape = ModelShape(**payload["shape"])
        module = build_module(shape)
        module.load_state_dict(payload["state_dict"])
    except (TypeError, RuntimeError, ValueError) as e:
        raise CheckpointError(f"{path}: its shape and tensors do not make a model: {e}".splitlines()[0]) from None
    symbols = payload["symbols"]
    # A list's model has one token beyond its symbols (the boundary); a text's has its symbols alone.
    if not isinstance(symbols, list | tuple) or shape.vocab not in (len(symbols), len(symbols) + 1):
        count = len(symbols) if isinstance(symbols, list | tuple) else "no list of"
        raise CheckpointError(f"{path} has {count} symbols for the {shape.vocab} tokens of its model (a list's "
                              "model has one more, its boundary; a text's the same number)")
    try:
        vocab = Vocabulary(tuple(symbols), with_boundary=shape.vocab == len(symbols) + 1)
    except (TypeError, DataError) as e:
        raise CheckpointError(f"{path}: its symbols are not a vocabulary: {e}") from None
    return module, vocab



def generate(module: Any, vocab: Vocabulary, n: int = 20, temperature: float = 0.5, seed: int = 0, *,
             prefix: str = "", max_len: int | None = None) -> list[str]:
    """n names sampled from a module of build_module (load_export's, say) in torch alone: each starts at the
    boundary token and `prefix` and ends at the next boundary or after max_len characters (default and upper
    bound: the context); temperature 0 is greedy; the same seed gives the same names. Draws use torch's
    generator, so they are not the names eemicrogpt's own `sample` draws with that seed; greedy names are."""
    torch = import_torch()
    context = module.shape.context
    max_len = context if max_len is None else max_len
    if not 1 <= max_len <= context:
        raise ConfigError(f"max length must be 1..{context} (the model's context), got {max_len}")
    if not (temperature >= 0 and np.isfinite(temperature)):
        raise ConfigError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature}")
    bad = vocab.unknown(prefix)
    if bad is not None:
        raise ConfigError(f"the prefix's character {bad!r} is not in the model's vocabulary")
    boundary = vocab.boundary
    seqs = torch.tensor([[boundary, *vocab.encode(prefix)]] * n, dtype=torch.int64)
    finished = torch.zeros(n, dtype=torch.bool)
    draws = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        while seqs.shape[1] <= max_len and not bool(finished.all()):
            logits = module(seqs)[:, -1]
            if temperature == 0:
                nxt = logits.argmax(dim=-1)
            else:
                probs = torch.softmax(logits / temperature, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=draws)[:, 0]
            nxt[finished] = boundary
            finished |= nxt == boundary
            seqs = torch.cat([seqs, nxt[:, None]], dim=1)
    return [vocab.decode(row[1:].tolist()) for row in seqs]
