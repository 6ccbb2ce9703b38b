"""The model as an ONNX graph (optional: needs the onnx package), built node by node with onnx.helper.

Input `tokens`: int64 [batch, T] token prefixes, 1 <= T <= context, each starting with the boundary token.
Output `logits`: float32 [batch, T, vocab], row t predicting the token after position t (so [:, -1] is the
next token of each prefix). The maths is reference.py's (and torch_model.py's): x = rms(tok_emb[t] +
pos_emb[pos]); per layer x += attention(rms(x)) Wo^T and x += relu(rms(x) Wf1^T) Wf2^T; logits = x Wlm^T.
The metadata holds eemicrogpt.shape, eemicrogpt.config and eemicrogpt.symbols (JSON), as the safetensors
export does.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from ..base.errors import ConfigError
from ..model.shape import LAYER_TENSORS, RMS_EPS, ModelShape, views

OPSET = 17  # ReduceMean with an axes attribute; onnxruntime 1.16+ runs it
METADATA_PREFIX = "eemicrogpt."


def import_onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise ConfigError("--format onnx needs the onnx package: pip install 'eemicrogpt[onnx]'") from None
    return onnx


class _Graph:
    """Nodes and initializers under fresh names."""

    def __init__(self, onnx: Any) -> None:
        self.helper, self.numpy_helper = onnx.helper, onnx.numpy_helper
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self.count = 0

    def const(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(self.numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, kind: str, *inputs: str, **attrs: Any) -> str:
        self.count += 1
        out = f"{kind.lower()}_{self.count}"
        self.nodes.append(self.helper.make_node(kind, list(inputs), [out], **attrs))
        return out

    def rms(self, x: str, eps: str) -> str:
        mean = self.op("ReduceMean", self.op("Mul", x, x), axes=[-1], keepdims=1)
        return self.op("Div", x, self.op("Sqrt", self.op("Add", mean, eps)))


def onnx_model(params: np.ndarray, shape: ModelShape, symbols: tuple[str, ...], config: dict[str, Any]) -> Any:
    """The ONNX ModelProto of these parameters (checked by onnx.checker)."""
    onnx = import_onnx()
    g = _Graph(onnx)
    w = {name: np.asarray(t, dtype=np.float32) for name, t in views(shape, params).items()}
    d, h, hd, c = shape.d_model, shape.n_heads, shape.head_dim, shape.context
    eps = g.const("rms_eps", np.array(RMS_EPS, np.float32))
    scale = g.const("attention_scale", np.array(1.0 / np.sqrt(hd), np.float32))
    causal = g.const("causal_mask", np.triu(np.full((c, c), -np.inf, np.float32), k=1))
    heads = g.const("heads_shape", np.array([0, 0, h, hd], np.int64))  # 0: keep that dimension
    merged = g.const("merged_shape", np.array([0, 0, d], np.int64))
    zero = g.const("zero", np.array([0], np.int64))
    zeros2 = g.const("zeros2", np.array([0, 0], np.int64))

    length = g.op("Shape", "tokens", start=1, end=2)  # [T]
    pos = g.op("Slice", g.const("pos_emb", w["pos_emb"]), zero, length, zero)
    x = g.rms(g.op("Add", g.op("Gather", g.const("tok_emb", w["tok_emb"]), "tokens"), pos), eps)
    mask = g.op("Slice", causal, zeros2, g.op("Concat", length, length, axis=0))
    for i in range(shape.n_layers):
        t = {name: g.const(f"layers.{i}.{name}.T", w[f"layers.{i}.{name}"].T) for name in LAYER_TENSORS}
        n1 = g.rms(x, eps)
        q, k, v = (g.op("Reshape", g.op("MatMul", n1, t[m]), heads) for m in ("Wq", "Wk", "Wv"))
        scores = g.op("MatMul", g.op("Transpose", q, perm=[0, 2, 1, 3]), g.op("Transpose", k, perm=[0, 2, 3, 1]))
        probs = g.op("Softmax", g.op("Add", g.op("Mul", scores, scale), mask), axis=-1)
        att = g.op("MatMul", probs, g.op("Transpose", v, perm=[0, 2, 1, 3]))
        att = g.op("Reshape", g.op("Transpose", att, perm=[0, 2, 1, 3]), merged)
        x = g.op("Add", x, g.op("MatMul", att, t["Wo"]))
        hidden = g.op("Relu", g.op("MatMul", g.rms(x, eps), t["Wf1"]))
        x = g.op("Add", x, g.op("MatMul", hidden, t["Wf2"]))
    g.nodes.append(g.helper.make_node("MatMul", [x, g.const("Wlm.T", w["Wlm"].T)], ["logits"]))

    graph = g.helper.make_graph(
        g.nodes, "eemicrogpt",
        [g.helper.make_tensor_value_info("tokens", onnx.TensorProto.INT64, ["batch", "T"])],
        [g.helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["batch", "T", shape.vocab])],
        g.initializers,
    )
    model = g.helper.make_model(graph, opset_imports=[g.helper.make_opsetid("", OPSET)],
                                producer_name="eemicrogpt")
    model.ir_version = 8  # what onnxruntime releases since 1.10 read
    g.helper.set_model_props(model, {
        f"{METADATA_PREFIX}shape": json.dumps(dataclasses.asdict(shape)),
        f"{METADATA_PREFIX}symbols": json.dumps(list(symbols), ensure_ascii=False),
        f"{METADATA_PREFIX}config": json.dumps(config),
    })
    onnx.checker.check_model(model)
    return model


def onnx_bytes(params: np.ndarray, shape: ModelShape, symbols: tuple[str, ...], config: dict[str, Any]) -> bytes:
    return bytes(onnx_model(params, shape, symbols, config).SerializeToString())
