"""Export round trips: the safetensors file holds the run's tensors by name with its shape, config and
vocabulary, and a model rebuilt from the file alone gives the same logits and the same greedy names."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from extras import import_extra
from typer.testing import CliRunner

import eemicrogpt
from eemicrogpt_core.base.errors import CheckpointError
from eemicrogpt_core.interface.cli import app
from eemicrogpt_core.model.sampling import forward_logits, generate
from eemicrogpt_core.model.shape import ModelShape, init_params
from eemicrogpt_core.model.vocab import Vocabulary

safetensors_numpy = import_extra("safetensors.numpy", "pip install -e '.[test]'")

# float32 torch against our float64 forward pass: measured at most 1.1e-6 over these shapes and the trained
# run (float32 rounding, about eps * |logit| * depth, for logits of magnitude <= 3.5); 1e-5 leaves ~10x.
LOGIT_TOL = 1e-5
# Random initialisations (init_params, the trainer's start) at the shapes the export must cover: one and
# several layers, the names vocabulary and a wider one, short and long contexts.
SHAPES = [ModelShape(16, 4, 1, 27, 16), ModelShape(32, 4, 2, 64, 32), ModelShape(24, 3, 3, 40, 7)]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> eemicrogpt.Run:
    """A two-layer model on names with capitals, a space and an accent (the file is written here)."""
    work = tmp_path_factory.mktemp("export")
    data = work / "names.txt"
    data.write_text("Anna\nJosé\nmary ann\nZoë\nbob\nO'Neil\n" * 4, encoding="utf-8")
    return eemicrogpt.train(d_model=16, n_layers=2, context=12, steps=30, log_every=30, data=data,
                            backend="numpy_ref", out=str(work / "run"), progress=False)


@pytest.fixture(scope="module")
def torch() -> ModuleType:
    return import_extra("torch", "pip install torch==2.13.0 (scripts/setup.sh does)")


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


def _vocab(shape: ModelShape) -> Vocabulary:
    """shape.vocab - 1 distinct printable symbols in code-point order (the boundary is the last token)."""
    printable = (c for c in map(chr, range(ord("A"), 0x250)) if c.isprintable())
    return Vocabulary(tuple(itertools.islice(printable, shape.vocab - 1)))


def _torch_logits(torch: ModuleType, module: Any, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return np.asarray(module(torch.from_numpy(tokens.astype(np.int64))).numpy(), dtype=np.float64)


def _torch_greedy(module: Any, vocab: Vocabulary) -> str:
    """The most likely name under the torch module, by torch_model.generate alone."""
    from eemicrogpt_core.tools.torch_model import generate as torch_generate

    return torch_generate(module, vocab, 1, temperature=0)[0]


def _assert_greedy_matches(torch: ModuleType, module: Any, params: np.ndarray, shape: ModelShape,
                           vocab: Vocabulary) -> None:
    ours = generate(params, shape, vocab, 1, temperature=0)[0]
    # The comparison means something only where the choice is clear: at every step of our greedy name the
    # top two logits differ by more than twice the float32 error allowed (else a tie could flip either way).
    tokens = np.array([[vocab.boundary, *vocab.encode(ours)]])[:, : shape.context]
    top2 = np.sort(forward_logits(params, shape, tokens)[0], axis=1)[:, -2:]
    assert np.min(top2[:, 1] - top2[:, 0]) > 2 * LOGIT_TOL
    assert len(ours) >= 3  # a name, not an immediate boundary
    assert _torch_greedy(module, vocab) == ours


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"d{s.d_model}h{s.n_heads}L{s.n_layers}V{s.vocab}C{s.context}")
def test_torch_module_matches_at_shapes(torch: ModuleType, shape: ModelShape) -> None:
    params = init_params(shape, seed=1)
    module = eemicrogpt.Run(params, shape, _vocab(shape), None, None, 0, 0).to_torch()  # type: ignore[arg-type]
    tokens = np.random.default_rng(0).integers(0, shape.vocab, size=(3, shape.context))
    tokens[:, 0] = shape.boundary
    got = _torch_logits(torch, module, tokens)
    assert got.shape == (3, shape.context, shape.vocab)
    assert np.max(np.abs(got - forward_logits(params, shape, tokens))) <= LOGIT_TOL
    prefix = tokens[:, : max(1, shape.context // 2)]  # a shorter sequence sees the same causal prefix
    assert np.max(np.abs(_torch_logits(torch, module, prefix) - got[:, : prefix.shape[1]])) <= LOGIT_TOL
    _assert_greedy_matches(torch, module, params, shape, _vocab(shape))


def test_torch_module_of_a_trained_run(torch: ModuleType, run: eemicrogpt.Run) -> None:
    module = run.to_torch()
    tokens = np.array([[run.vocab.boundary, *run.vocab.encode(name)] for name in ("José", "Zoë ")])
    want = forward_logits(run.params, run.shape, tokens)
    assert np.max(np.abs(_torch_logits(torch, module, tokens) - want)) <= LOGIT_TOL
    _assert_greedy_matches(torch, module, run.params, run.shape, run.vocab)
    with pytest.raises(ValueError, match=r"sequence length must be 1\.\.12"):
        module(torch.zeros((1, run.shape.context + 1), dtype=torch.int64))


def test_torch_export_loads_into_the_module(torch: ModuleType, run: eemicrogpt.Run, tmp_path: Path) -> None:
    from eemicrogpt_core.tools.torch_model import load_export

    path = run.export(tmp_path / "m.pt", format="torch")
    module, vocab = load_export(path)
    assert vocab == run.vocab and module.shape == run.shape
    state = module.state_dict()
    assert sorted(state) == sorted(run.shape.tensor_names)  # the layout names
    flat = np.concatenate([state[name].numpy().reshape(-1) for name in run.shape.tensor_names])
    assert np.array_equal(flat, run.params)
    _assert_greedy_matches(torch, module, run.params, run.shape, vocab)


def test_torch_export_of_a_text_run_loads_with_its_text_vocabulary(torch: ModuleType, tmp_path: Path) -> None:
    from eemicrogpt_core.tools.torch_model import load_export

    play = tmp_path / "play.txt"
    play.write_text("to be, or not to be:\nthat is the question.\n" * 40, encoding="utf-8")
    text = eemicrogpt.train(data=play, data_format="text", d_model=16, context=8, steps=5, log_every=5,
                            out=str(tmp_path / "t"), progress=False)
    module, vocab = load_export(text.export(tmp_path / "t.pt", format="torch"))
    assert vocab == text.vocab and not vocab.with_boundary and module.shape.vocab == vocab.size
    tokens = np.array([vocab.encode("to be, o")])
    want = forward_logits(text.params, text.shape, tokens)
    assert np.max(np.abs(_torch_logits(torch, module, tokens) - want)) <= LOGIT_TOL


def test_cli_exports_torch(torch: ModuleType, run: eemicrogpt.Run, tmp_path: Path) -> None:
    from eemicrogpt_core.tools.torch_model import load_export

    out = tmp_path / "cli.pt"
    result = CliRunner().invoke(app, ["export", str(run.run_dir), "--out", str(out), "--format", "torch"])
    assert result.exit_code == 0, result.output
    assert f"wrote {out} (torch)" in result.output
    module, vocab = load_export(out)
    assert vocab == run.vocab
    assert _torch_greedy(module, vocab) == run.sample(1, temperature=0)[0]


def test_load_export_refuses_a_foreign_file(torch: ModuleType, tmp_path: Path) -> None:
    from eemicrogpt_core.tools.torch_model import load_export

    not_torch = tmp_path / "names.pt"
    not_torch.write_text("anna\n")
    with pytest.raises(CheckpointError, match="is not a torch file eemicrogpt can read"):
        load_export(not_torch)
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, str(other))
    with pytest.raises(CheckpointError, match="is not an eemicrogpt torch export"):
        load_export(other)


def test_torch_generate_samples_without_a_run(torch: ModuleType, run: eemicrogpt.Run, tmp_path: Path) -> None:
    from eemicrogpt_core.tools.torch_model import generate as torch_generate
    from eemicrogpt_core.tools.torch_model import load_export

    module, vocab = load_export(run.export(tmp_path / "m.pt", format="torch"))
    names = torch_generate(module, vocab, 30, temperature=1.0, seed=3, prefix="J", max_len=6)
    assert len(names) == 30 and all(n.startswith("J") and len(n) <= 6 for n in names)
    assert all(vocab.unknown(n) is None for n in names) and len(set(names)) > 1  # drawn, not one greedy name
    assert torch_generate(module, vocab, 30, temperature=1.0, seed=3, prefix="J", max_len=6) == names
    assert torch_generate(module, vocab, 30, temperature=1.0, seed=4, prefix="J", max_len=6) != names
    with pytest.raises(eemicrogpt.ConfigError, match=r"max length must be 1\.\.12"):
        torch_generate(module, vocab, 1, max_len=13)
