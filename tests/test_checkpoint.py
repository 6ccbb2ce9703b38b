"""Checkpoints round-trip exactly (format 3: the shape and the symbol table), are written atomically, damaged
ones give clear errors, and format-2 files (a-z, one layer, 16 pos_emb rows) still load."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from legacy_checkpoint import read_meta, write_format_2, write_members

from eemicrogpt_core.backends.backend import STATE_ARRAYS, TrainState
from eemicrogpt_core.base.errors import CheckpointError
from eemicrogpt_core.data.names import BatchSampler, encode
from eemicrogpt_core.model.shape import ModelShape, views
from eemicrogpt_core.model.vocab import Vocabulary
from eemicrogpt_core.training.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from eemicrogpt_core.training.config import TrainConfig

CFG = TrainConfig(d_model=16, steps=100, data="/somewhere/names.txt")
NAMES = Vocabulary.names()
# A vocabulary of the kind users bring: spaces, punctuation, capitals, accents, a symbol.
OWN = Vocabulary.from_names(["St. Louis", "Zoë", "mr. mime", "nidoran♀", "ho-oh"])
OWN_CFG = TrainConfig(d_model=16, n_layers=2, context=20, steps=100, data="/somewhere/own.txt")


def _checkpoint(dtype: type = np.float32, cfg: TrainConfig = CFG, vocab: Vocabulary = NAMES) -> Checkpoint:
    rng = np.random.default_rng(0)
    n = cfg.model_shape(vocab.size).n_params
    params, m, v = (rng.standard_normal(n).astype(dtype) for _ in range(3))
    state = TrainState(params, m, np.abs(v), step=37)  # adam_v is a mean of squares: never negative
    sampler = BatchSampler(encode(["ab", "cde"], NAMES, cfg.context)[0], 4, seed=1)
    sampler.sample(5)
    return Checkpoint(state, 100, sampler.get_state(), cfg, vocab, [2.5, 2.25], "numpy_ref")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_round_trip_is_exact(tmp_path: Path, dtype: type) -> None:
    ckpt = _checkpoint(dtype)
    path = tmp_path / "checkpoint.npz"
    save_checkpoint(path, ckpt)
    back = load_checkpoint(path)
    for name in STATE_ARRAYS:
        original, loaded = getattr(ckpt.state, name), getattr(back.state, name)
        assert loaded.dtype == dtype and np.array_equal(original, loaded)
    assert back.state.step == 37 and back.total_steps == 100
    assert back.config == CFG and back.recent_losses == [2.5, 2.25] and back.backend == "numpy_ref"
    assert back.vocab == NAMES and back.shape == ModelShape(16, 4)
    data = encode(["ab", "cde"], NAMES, CFG.context)[0]
    a, b = BatchSampler(data, 4, seed=1), BatchSampler(data, 4, seed=9)
    a.set_state(ckpt.sampler_state)
    b.set_state(back.sampler_state)
    assert np.array_equal(a.sample(3)[0], b.sample(3)[0])


def test_format_3_keeps_symbols_layers_and_context(tmp_path: Path) -> None:
    ckpt = _checkpoint(cfg=OWN_CFG, vocab=OWN)
    path = tmp_path / "checkpoint.npz"
    save_checkpoint(path, ckpt)
    meta = read_meta(path)
    assert meta["version"] == 3 and meta["symbols"] == list(OWN.symbols)
    back = load_checkpoint(path)
    assert back.vocab == OWN and back.vocab.symbols[0] == " " and "♀" in back.vocab.symbols
    assert back.shape == ModelShape(16, 4, n_layers=2, vocab=OWN.size, context=20)
    assert back.config.n_layers == 2 and back.config.context == 20
    assert np.array_equal(back.state.params, ckpt.state.params)
    layer1 = views(back.shape, back.state.params)["layers.1.Wf2"]
    assert np.array_equal(layer1, views(back.shape, ckpt.state.params)["layers.1.Wf2"])


def test_overwrite_leaves_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.npz"
    save_checkpoint(path, _checkpoint())
    save_checkpoint(path, _checkpoint())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.npz"]


def test_missing_and_garbage_files(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        load_checkpoint(tmp_path / "absent.npz")
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip at all")
    with pytest.raises(CheckpointError, match="unreadable checkpoint"):
        load_checkpoint(garbage)


def test_foreign_npz_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "other.npz"
    np.savez(path, weights=np.zeros(3))
    with pytest.raises(CheckpointError, match="not an eemicrogpt checkpoint"):
        load_checkpoint(path)


def test_shape_mismatch_is_rejected(tmp_path: Path) -> None:
    ckpt = _checkpoint()
    path = tmp_path / "checkpoint.npz"
    save_checkpoint(path, Checkpoint(ckpt.state, 100, ckpt.sampler_state, TrainConfig(d_model=32), NAMES, [], ""))
    with pytest.raises(CheckpointError, match=r"params.npy has shape \(4192,\).*d32, 4 heads, 1 layer, vocab 27"):
        load_checkpoint(path)
    # the same buffer under a bigger symbol table is refused too: the vocabulary sizes tok_emb and Wlm
    save_checkpoint(path, Checkpoint(ckpt.state, 100, ckpt.sampler_state, CFG, OWN, [], ""))
    with pytest.raises(CheckpointError, match=rf"params.npy has shape \(4192,\).*vocab {OWN.size}"):
        load_checkpoint(path)


def test_step_beyond_total_is_rejected(tmp_path: Path) -> None:
    ckpt = _checkpoint()
    path = tmp_path / "checkpoint.npz"
    save_checkpoint(path, Checkpoint(ckpt.state, 10, ckpt.sampler_state, CFG, NAMES, [], ""))
    with pytest.raises(CheckpointError, match=r"step 37 is outside 0\.\.10"):
        load_checkpoint(path)


@pytest.mark.parametrize(("symbols", "message"), [
    (None, "symbols must be a list of characters"),
    ("abc", "symbols must be a list of characters"),
    ([1, 2], "symbols must be a list of characters"),
    (["b", "a"], "damaged symbol table"),
    (["a", "a"], "damaged symbol table"),
    (["ab"], "damaged symbol table"),
    ([], "damaged symbol table"),
])
def test_a_damaged_symbol_table_is_refused(tmp_path: Path, symbols: Any, message: str) -> None:
    path = tmp_path / "checkpoint.npz"
    save_checkpoint(path, _checkpoint())
    meta = read_meta(path)
    if symbols is None:
        del meta["symbols"]
    else:
        meta["symbols"] = symbols
    ckpt = _checkpoint()
    write_members(path, meta, {"params": ckpt.state.params, "adam_m": ckpt.state.adam_m, "adam_v": ckpt.state.adam_v})
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path)


def test_format_2_loads_as_a_to_z_one_layer_context_15(tmp_path: Path) -> None:
    cfg = TrainConfig(d_model=16, context=15, steps=100, data="/somewhere/names.txt")
    ckpt = _checkpoint(cfg=cfg)
    path = tmp_path / "checkpoint.npz"
    write_format_2(path, ckpt)
    back = load_checkpoint(path)
    assert back.vocab == NAMES and back.shape == ModelShape(16, 4, n_layers=1, vocab=27, context=15)
    assert back.config.context == 15 and back.config.n_layers == 1
    for name in STATE_ARRAYS:  # the 16th row is dropped, every other value kept exactly
        assert np.array_equal(getattr(back.state, name), getattr(ckpt.state, name)), name
    assert back.state.step == 37 and back.total_steps == 100 and back.recent_losses == [2.5, 2.25]
    assert back.versions == {"eemicrogpt": "0.1.0"}


def test_format_2_with_the_wrong_size_names_the_stored_layout(tmp_path: Path) -> None:
    cfg = TrainConfig(d_model=16, context=15, steps=100)
    ckpt = _checkpoint(cfg=cfg)
    path = tmp_path / "checkpoint.npz"
    write_format_2(path, ckpt)
    meta = read_meta(path)
    meta["config"]["d_model"] = 32
    with zipfile.ZipFile(path) as zf:
        arrays = {k: np.load(io.BytesIO(zf.read(f"{k}.npy"))) for k in ("params", "adam_m", "adam_v")}
    write_members(path, meta, arrays)
    with pytest.raises(CheckpointError, match=r"expected \(14528,\).*d32, 4 heads, 1 layer, vocab 27, context 16"):
        load_checkpoint(path)
