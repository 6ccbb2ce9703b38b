"""ONNX export: onnxruntime's logits for token prefixes match ours, the vocabulary is in the metadata, and
docs/usage.md's sampling example runs with onnxruntime alone."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from extras import import_extra
from typer.testing import CliRunner

import eemicrogpt
from eemicrogpt_core.interface.cli import app
from eemicrogpt_core.model.sampling import forward_logits
from eemicrogpt_core.model.shape import ModelShape, init_params
from eemicrogpt_core.model.vocab import Vocabulary
from eemicrogpt_core.tools.onnx_model import onnx_bytes

ort = import_extra("onnxruntime", "pip install 'eemicrogpt[onnx]'")
import_extra("onnx", "pip install 'eemicrogpt[onnx]'")

USAGE = Path(__file__).resolve().parents[1] / "docs" / "usage.md"
# onnxruntime's float32 against our float64 forward pass: measured at most 1.1e-6 for a trained d16 run
# (logits up to 5.7) and the random initialisations below, float32 rounding of about eps * |logit| * depth;
# 1e-5 leaves ~10x, the bound the torch export is held to.
LOGIT_TOL = 1e-5
SHAPES = [ModelShape(16, 4, 1, 27, 16), ModelShape(32, 4, 2, 64, 32), ModelShape(24, 3, 3, 40, 7)]


def session(data: bytes) -> Any:
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def prefixes(shape: ModelShape, batch: int, length: int, seed: int = 0) -> np.ndarray:
    tokens = np.random.default_rng(seed).integers(0, shape.vocab, size=(batch, length))
    tokens[:, 0] = shape.vocab - 1  # the boundary starts every prefix
    return tokens.astype(np.int64)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"d{s.d_model}h{s.n_heads}L{s.n_layers}V{s.vocab}C{s.context}")
def test_logits_match_ours_at_every_length(shape: ModelShape) -> None:
    params = init_params(shape, seed=1)
    symbols = tuple(chr(ord("A") + i) for i in range(shape.vocab - 1))
    s = session(onnx_bytes(params, shape, symbols, {"d_model": shape.d_model}))
    for length in sorted({1, 2, shape.context // 2 or 1, shape.context}):
        tokens = prefixes(shape, 3, length, seed=length)
        (got,) = s.run(None, {"tokens": tokens})
        assert got.dtype == np.float32 and got.shape == (3, length, shape.vocab)
        assert np.max(np.abs(got - forward_logits(params, shape, tokens))) <= LOGIT_TOL


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, names_file: Path) -> eemicrogpt.Run:
    work = tmp_path_factory.mktemp("onnx")
    return eemicrogpt.train(d_model=16, steps=200, log_every=100, data=names_file, backend="numpy_ref",
                            out=str(work / "run"), progress=False)


def test_cli_export_of_a_trained_run(run: eemicrogpt.Run, tmp_path: Path) -> None:
    out = tmp_path / "m.onnx"
    result = CliRunner().invoke(app, ["export", str(run.run_dir), "--out", str(out), "--format", "onnx"])
    assert result.exit_code == 0 and f"wrote {out} (onnx)" in result.output, result.output
    s = session(out.read_bytes())
    meta = s.get_modelmeta().custom_metadata_map
    assert Vocabulary(tuple(json.loads(meta["eemicrogpt.symbols"]))) == run.vocab
    assert ModelShape(**json.loads(meta["eemicrogpt.shape"])) == run.shape
    assert json.loads(meta["eemicrogpt.config"])["steps"] == 200
    tokens = np.array([[run.vocab.boundary, *run.vocab.encode(name)] for name in ("emma", "liam")], np.int64)
    (got,) = s.run(None, {"tokens": tokens})
    assert np.max(np.abs(got - forward_logits(run.params, run.shape, tokens))) <= LOGIT_TOL
    again = CliRunner().invoke(app, ["export", str(run.run_dir), "--out", str(out), "--format", "onnx"])
    assert again.exit_code == 2 and "already exists" in again.stderr


def test_the_documented_sampling_example_runs(run: eemicrogpt.Run, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    (example,) = [b for b in re.findall(r"```python\n(.*?)```", USAGE.read_text(), re.S) if "onnxruntime" in b]
    assert len(example.strip().splitlines()) <= 12
    monkeypatch.chdir(tmp_path)
    run.export("d32.onnx", "onnx")  # the file name the example opens
    exec(compile(example, str(USAGE), "exec"), {})
    names = capsys.readouterr().out.split()
    assert len(names) == 5 and all(run.vocab.unknown(n) is None and 1 <= len(n) <= run.shape.context
                                   for n in names)
