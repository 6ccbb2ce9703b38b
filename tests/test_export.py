"""Export round trips: the safetensors file holds the run's tensors by name with its shape, config and
vocabulary, and a model rebuilt from the file alone gives the same logits and the same greedy names."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import eemicrogpt
from eemicrogpt_core.model import ModelShape
from eemicrogpt_core.sampling import forward_logits, generate
from eemicrogpt_core.vocab import Vocabulary

safetensors_numpy = pytest.importorskip("safetensors.numpy", reason="the test extra installs safetensors")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> eemicrogpt.Run:
    """A two-layer model on names with capitals, a space and an accent (the file is written here)."""
    work = tmp_path_factory.mktemp("export")
    data = work / "names.txt"
    data.write_text("Anna\nJosé\nmary ann\nZoë\nbob\nO'Neil\n" * 4, encoding="utf-8")
    return eemicrogpt.train(d_model=16, n_layers=2, context=12, steps=30, log_every=30, data=data,
                            backend="numpy_ref", out=str(work / "run"), progress=False)


def _from_file(path: Path) -> tuple[np.ndarray, ModelShape, Vocabulary, dict[str, str]]:
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        metadata = f.metadata()
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open is not a mapping)
    shape = ModelShape(**json.loads(metadata["eemicrogpt.shape"]))
    vocab = Vocabulary(tuple(json.loads(metadata["eemicrogpt.symbols"])))
    flat = np.concatenate([tensors[name].reshape(-1) for name in shape.tensor_names])
    return flat, shape, vocab, metadata


def test_safetensors_round_trip(run: eemicrogpt.Run, tmp_path: Path) -> None:
    path = run.export(tmp_path / "m.safetensors")
    flat, shape, vocab, metadata = _from_file(path)
    assert shape == run.shape and vocab == run.vocab and shape.n_layers == 2
    assert json.loads(metadata["eemicrogpt.config"])["d_model"] == 16
    assert flat.dtype == np.float32 and np.array_equal(flat, run.params)
    tokens = np.array([[vocab.boundary, *vocab.encode("José")]])
    ours = forward_logits(run.params, run.shape, tokens)
    theirs = forward_logits(flat, shape, tokens)
    assert np.max(np.abs(ours - theirs)) <= 1e-5
    assert generate(flat, shape, vocab, 3, temperature=0) == run.sample(3, temperature=0)


def test_export_never_replaces_a_file(run: eemicrogpt.Run, tmp_path: Path) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    with pytest.raises(eemicrogpt.ConfigError, match="already exists"):
        run.export(target)
    assert target.read_text() == "mine"


def test_torch_module_matches(run: eemicrogpt.Run) -> None:
    torch = pytest.importorskip("torch", reason="PyTorch is an optional extra, not installed here")
    module = run.to_torch()
    tokens = np.array([[run.vocab.boundary, *run.vocab.encode("Anna")]])
    with torch.no_grad():
        got = module(torch.from_numpy(tokens)).numpy()
    want = forward_logits(run.params, run.shape, tokens)
    assert np.max(np.abs(got - want)) <= 1e-5
