"""The model as a PyTorch nn.Module (optional: needs torch), for using an exported run elsewhere.

The same maths as reference.py in torch ops: x = rms(tok_emb[t] + pos_emb[pos]); per layer a pre-norm causal
attention block and a pre-norm ReLU MLP block with residuals; logits = x Wlm^T. No biases, no norm gains.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import ConfigError
from .model import LAYER_TENSORS, RMS_EPS, ModelShape, layer_tensor, views


def import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ConfigError("this needs PyTorch: pip install torch") from None
    return torch


def to_torch(params: np.ndarray, shape: ModelShape) -> Any:
    """An nn.Module holding these parameters; module(tokens [B, T] int64) -> logits [B, T, vocab]."""
    torch = import_torch()
    nn = torch.nn

    class MicroGPT(nn.Module):  # type: ignore[name-defined]  # torch is imported at call time
        def __init__(self) -> None:
            super().__init__()
            self.shape = shape
            for name, tensor in views(shape, params).items():
                self.register_parameter(name.replace(".", "_"), nn.Parameter(torch.from_numpy(tensor.copy())))
            mask = torch.ones(shape.context, shape.context, dtype=torch.bool).tril()
            self.register_buffer("causal", mask, persistent=False)

        def weight(self, name: str) -> Any:
            return getattr(self, name.replace(".", "_"))

        @staticmethod
        def rms(x: Any) -> Any:
            return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + RMS_EPS)

        def forward(self, tokens: Any) -> Any:
            b, t = tokens.shape
            h, hd = shape.n_heads, shape.head_dim
            pos = torch.arange(t, device=tokens.device)
            x = self.rms(self.weight("tok_emb")[tokens] + self.weight("pos_emb")[pos])
            for layer in range(shape.n_layers):
                w = {name: self.weight(layer_tensor(layer, name)) for name in LAYER_TENSORS}
                n1 = self.rms(x)
                q, k, v = ((n1 @ w[m].T).view(b, t, h, hd).transpose(1, 2) for m in ("Wq", "Wk", "Wv"))
                scores = (q @ k.transpose(-1, -2)) / hd**0.5
                scores = scores.masked_fill(~self.causal[:t, :t], float("-inf"))
                att = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, t, shape.d_model)
                x = x + att @ w["Wo"].T
                x = x + torch.relu(self.rms(x) @ w["Wf1"].T) @ w["Wf2"].T
            return x @ self.weight("Wlm").T

    return MicroGPT()
