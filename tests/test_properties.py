"""Property-based tests (hypothesis) of the three readers that take files from users: config, names, checkpoint.

The property in each case: whatever the input, the reader returns a valid value or raises its one user error
(ConfigError, DataError, CheckpointError) - never another exception, never garbage.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import unicodedata
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eemicrogpt_core.backends.backend import STATE_ARRAYS, TrainState
from eemicrogpt_core.base.errors import CheckpointError, ConfigError, DataError
from eemicrogpt_core.data.names import BatchSampler, encode, parse_names, read_names, sampler_state_problem
from eemicrogpt_core.model.shape import DEFAULT_CONTEXT
from eemicrogpt_core.model.vocab import Vocabulary
from eemicrogpt_core.training.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from eemicrogpt_core.training.config import TrainConfig, build_config, dump_yaml, parse_yaml, read_yaml

FILES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
KEYS = [f.name for f in dataclasses.fields(TrainConfig)]

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=20))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5),
                                                                                          inner, max_size=3),
                      max_leaves=8)


# ------------------------------------------------------------------------------------------------- config


@FILES
@given(st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=10), values, max_size=6))
def test_build_config_returns_a_valid_config_or_a_config_error(mapping: dict[str, Any]) -> None:
    try:
        cfg = build_config([("test.yaml", mapping)])
    except ConfigError as e:
        assert str(e).startswith(("test.yaml: ", "built-in default: ")) and "\n" not in str(e)
        return
    assert 1 <= cfg.d_model <= 1024 and cfg.d_model % cfg.n_heads == 0 and 1 <= cfg.batch <= 4096
    assert math.isfinite(cfg.lr) and cfg.lr >= 0 and 0 <= cfg.seed < 2**63 and 0 <= cfg.val_fraction < 1
    assert 1 <= cfg.n_layers <= 8 and 1 <= cfg.context <= 64 and isinstance(cfg.lowercase, bool)


@FILES
@given(st.text(max_size=300))
def test_any_config_text_is_read_or_refused_in_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        build_config([(str(path), read_yaml(path))])
    except ConfigError as e:
        assert str(e).startswith((str(path), "config file", "cannot read config", "built-in default"))


@FILES
@given(st.lists(st.sampled_from(["1:30", "010", "0b11", "1_000", "1e-3", "0x1F", ".5", "yes", "on", "~", "-0"]),
                min_size=1, max_size=3))
def test_yaml_scalars_never_silently_change_meaning(words: list[str]) -> None:
    """A YAML 1.1-only reading is refused; what is accepted means what YAML 1.2 says."""
    text = "\n".join(f"k{i}: {w}" for i, w in enumerate(words))
    expected = {"1e-3": 0.001, "0x1F": 31, ".5": 0.5, "yes": "yes", "on": "on", "~": None, "-0": 0}
    try:
        data = parse_yaml(text)
    except Exception as e:
        assert "reads differently in YAML 1.1 and 1.2" in str(e)
        assert any(w in ("1:30", "010", "0b11", "1_000") for w in words)
        return
    assert data == {f"k{i}": expected[w] for i, w in enumerate(words)}


text_values = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)


@FILES
@given(data=st.none() | text_values, out=st.none() | text_values, backend=text_values.filter(str.strip),
       lr=st.floats(min_value=0, max_value=1e6), seed=st.integers(0, 2**63 - 1))
def test_saved_configs_round_trip_through_yaml(data: str | None, out: str | None, backend: str, lr: float,
                                               seed: int) -> None:
    """config.yaml in a run directory reads back as the same config, whatever the strings look like."""
    cfg = dataclasses.replace(TrainConfig(), data=data, out=out, backend=backend, lr=lr, seed=seed)
    assert build_config([("saved", parse_yaml(dump_yaml(cfg)))]) == cfg


# --------------------------------------------------------------------------------------------------- data


@FILES
@given(st.lists(st.text(max_size=20), max_size=20), st.booleans(), st.booleans(), st.integers(1, 64))
def test_parse_names_gives_clean_names_or_a_data_error(lines: list[str], drop_invalid: bool, lowercase: bool,
                                                       context: int) -> None:
    try:
        names = parse_names(lines, "n.txt", drop_invalid=drop_invalid, lowercase=lowercase)
    except DataError as e:
        assert str(e).startswith("n.txt") and "\n" not in str(e)
        return
    assert names.names and all(n and n == n.strip() and unicodedata.is_normalized("NFC", n) for n in names.names)
    assert not any(unicodedata.category(ch) == "Cc" for n in names.names for ch in n)
    if lowercase:
        assert all(n == n.lower() for n in names.names)
    try:
        vocab = Vocabulary.from_names(names.names)
    except DataError as e:  # more distinct characters than a vocabulary holds: one line naming the count
        assert "distinct characters" in str(e) and "\n" not in str(e)
        return
    data, truncated = encode(names.names, vocab, context)
    assert data.tokens.shape == (len(names.names), context + 1) and int(data.tokens.max()) < vocab.size
    assert int(data.lengths.min()) >= 2 and int(data.lengths.max()) <= context + 1
    assert all(data.tokens[i, 0] == vocab.boundary for i in range(len(data)))
    assert truncated == sum(len(n) + 2 > context + 1 for n in names.names)
    for i, name in enumerate(names.names):  # the tokens spell the name (up to the context) and nothing else
        assert vocab.decode(data.tokens[i, 1 : data.lengths[i]]) == name[:context]


@FILES
@given(st.binary(max_size=400))
def test_any_bytes_are_names_or_a_data_error(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "names.txt"
    path.write_bytes(raw)
    try:
        names = read_names(path)
    except DataError as e:
        assert str(e).startswith(str(path))
        return
    assert len(names.sha256) == 64 and names.names


pcg_states = st.fixed_dictionaries({
    "bit_generator": st.sampled_from(["PCG64", "MT19937", 3]),
    "state": st.fixed_dictionaries({"state": st.integers(-5, 2**130) | st.floats(), "inc": st.integers(-5, 2**130)}),
    "has_uint32": st.integers(-1, 2) | st.booleans(),
    "uinteger": st.integers(-1, 2**33),
})


@FILES
@given(pcg_states)
def test_a_sampler_state_judged_valid_is_accepted_exactly(state: dict[str, Any]) -> None:
    sampler = BatchSampler(encode(["ab", "cd"], Vocabulary.names(), DEFAULT_CONTEXT)[0], 2, seed=0)
    if sampler_state_problem(state) is None:
        sampler.set_state(state)
        assert sampler.get_state() == state
    else:
        with pytest.raises(DataError, match="invalid sampler state"):
            sampler.set_state(state)


# --------------------------------------------------------------------------------------------- checkpoint


@pytest.fixture(scope="module")
def valid_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    cfg = TrainConfig(d_model=16, n_layers=2, context=12, steps=100, data="/names.txt")
    vocab = Vocabulary.from_names(["Zoë -♀", "ab"])
    rng = np.random.default_rng(0)
    n = cfg.model_shape(vocab.size).n_params
    state = TrainState(rng.standard_normal(n).astype(np.float32), np.zeros(n, np.float32),
                       np.ones(n, np.float32), 37)
    sampler = BatchSampler(encode(["ab", "Zoë"], vocab, cfg.context)[0], 4, seed=1)
    path = tmp_path_factory.mktemp("ckpt") / "checkpoint.npz"
    save_checkpoint(path, Checkpoint(state, 100, sampler.get_state(), cfg, vocab, [2.5], "numpy_ref", "ab" * 32))
    return path.read_bytes()


def _load_or_refuse(path: Path) -> Checkpoint | None:
    try:
        ckpt = load_checkpoint(path)
    except CheckpointError as e:
        assert str(e).startswith((str(path), "checkpoint not found")) and "\n" not in str(e)
        return None
    for name in STATE_ARRAYS:
        array = getattr(ckpt.state, name)
        assert array.shape == (ckpt.shape.n_params,) and np.all(np.isfinite(array))
    assert ckpt.shape.vocab == ckpt.vocab.size and ckpt.shape.context == ckpt.config.context
    assert 0 <= ckpt.state.step <= ckpt.total_steps and sampler_state_problem(ckpt.sampler_state) is None
    return ckpt


@FILES
@given(st.binary(max_size=2000))
def test_any_bytes_are_refused_as_a_checkpoint(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "checkpoint.npz"
    path.write_bytes(raw)
    assert _load_or_refuse(path) is None


@FILES
@given(st.data())
def test_damaged_checkpoint_bytes_load_exactly_or_are_refused(tmp_path: Path, valid_checkpoint: bytes,
                                                              data: st.DataObject) -> None:
    raw = bytearray(valid_checkpoint)
    if data.draw(st.booleans(), label="truncate"):
        raw = raw[: data.draw(st.integers(0, len(raw) - 1), label="length")]
    for _ in range(data.draw(st.integers(0, 4), label="flips")):
        if raw:
            i = data.draw(st.integers(0, len(raw) - 1), label="at")
            raw[i] = data.draw(st.integers(0, 255), label="byte")
    path = tmp_path / "checkpoint.npz"
    path.write_bytes(bytes(raw))
    ckpt = _load_or_refuse(path)
    if ckpt is not None and bytes(raw) == valid_checkpoint:
        assert ckpt.state.step == 37


@FILES
@given(st.sampled_from(["step", "total_steps", "sampler_state", "recent_losses", "backend", "data_sha256",
                        "versions", "config", "format", "version", "symbols"]), values)
def test_tampered_metadata_loads_validly_or_is_refused(tmp_path: Path, valid_checkpoint: bytes, key: str,
                                                       value: Any) -> None:
    with zipfile.ZipFile(io.BytesIO(valid_checkpoint)) as zf:
        members = {name: zf.read(name) for name in zf.namelist()}
    meta = json.loads(str(np.load(io.BytesIO(members["meta.npy"]))))
    meta[key] = value
    buf = io.BytesIO()
    np.save(buf, np.array(json.dumps(meta)))
    members["meta.npy"] = buf.getvalue()
    path = tmp_path / "checkpoint.npz"
    with zipfile.ZipFile(path, "w") as zf:
        for name, content in members.items():
            zf.writestr(name, content)
    _load_or_refuse(path)
