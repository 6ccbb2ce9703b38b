"""Checkpoints round-trip exactly, are written atomically, and damaged ones give clear errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from eemicrogpt_core.backend import TrainState
from eemicrogpt_core.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from eemicrogpt_core.config import TrainConfig
from eemicrogpt_core.data import BatchSampler, encode
from eemicrogpt_core.errors import CheckpointError

CFG = TrainConfig(d_model=16, steps=100, data="/somewhere/names.txt")


def _checkpoint(dtype: type = np.float32) -> Checkpoint:
    rng = np.random.default_rng(0)
    n = CFG.shape.n_params
    params, m, v = (rng.standard_normal(n).astype(dtype) for _ in range(3))
    state = TrainState(params, m, np.abs(v), step=37)  # adam_v is a mean of squares: never negative
    sampler = BatchSampler(encode(["ab", "cde"])[0], 4, seed=1)
    sampler.sample(5)
    return Checkpoint(state, 100, sampler.get_state(), CFG, [2.5, 2.25], "numpy_ref")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_round_trip_is_exact(tmp_path: Path, dtype: type) -> None:
    ckpt = _checkpoint(dtype)
    path = tmp_path / "checkpoint.npz"
    save_checkpoint(path, ckpt)
    back = load_checkpoint(path)
    for name in ("params", "adam_m", "adam_v"):
        original, loaded = getattr(ckpt.state, name), getattr(back.state, name)
        assert loaded.dtype == dtype and np.array_equal(original, loaded)
    assert back.state.step == 37 and back.total_steps == 100
    assert back.config == CFG and back.recent_losses == [2.5, 2.25] and back.backend == "numpy_ref"
    a, b = BatchSampler(encode(["ab", "cde"])[0], 4, seed=1), BatchSampler(encode(["ab", "cde"])[0], 4, seed=9)
    a.set_state(ckpt.sampler_state)
    b.set_state(back.sampler_state)
    assert np.array_equal(a.sample(3)[0], b.sample(3)[0])


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
    save_checkpoint(path, Checkpoint(ckpt.state, 100, ckpt.sampler_state, TrainConfig(d_model=32), [], ""))
    with pytest.raises(CheckpointError, match=r"params.npy has shape \(4192,\).*d_model 32"):
        load_checkpoint(path)


def test_step_beyond_total_is_rejected(tmp_path: Path) -> None:
    ckpt = _checkpoint()
    path = tmp_path / "checkpoint.npz"
    save_checkpoint(path, Checkpoint(ckpt.state, 10, ckpt.sampler_state, CFG, [], ""))
    with pytest.raises(CheckpointError, match=r"step 37 is outside 0\.\.10"):
        load_checkpoint(path)
