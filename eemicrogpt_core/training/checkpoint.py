"""Checkpoints: everything a run needs to continue exactly, in one atomically written .npz file.

Arrays: params, adam_m, adam_v in the shared parameter layout, kept in the session's float dtype (float32,
or float64 for float64 runs) so that a resume is bit-exact. `meta` holds JSON: the step, the
total steps the LR schedule spans, the batch sampler's generator state, the resolved config, the recent
train losses (so the rolling mean continues too), the sha256 of the names file, the software versions,
(format 3) the vocabulary's symbols, and the run's training seconds so far and where it reached its
target_loss (target.py; files written before these fields read as 0 seconds and no target reached), and
the best validation loss so far with the rounds since it (best.py; absent before keep_best and patience). The
model's shape is the saved config's with that vocabulary.

Formats 1 and 2 predate symbol tables and per-layer shapes: they load as the makemore names' vocabulary
(a-z, case folded as those versions did), one layer and context 15 (their 16-token rows held at most 15
predictions; the never-trained 16th position row, whose Adam moments are zero, is dropped), so a resume
continues exactly as before.

Reading trusts nothing in the file: every .npy header inside the zip is checked (dtype, shape against the
saved config) before its data is read, so a small file cannot make the reader allocate gigabytes, and every
metadata field is type- and range-checked (safetensors' "header before data" rule).
"""

from __future__ import annotations

import io
import json
import math
import os
import platform
import tokenize
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from .. import __version__
from ..backends.backend import STATE_ARRAYS, TrainState
from ..base.atomic import atomic_write_bytes
from ..base.errors import CheckpointError, ConfigError, DataError
from ..base.reading import open_regular
from ..data.names import sampler_state_problem
from ..model.shape import ModelShape
from ..model.vocab import Vocabulary
from .best import BestSoFar
from .config import MAX_STEPS, TrainConfig, build_config
from .target import TargetReached

FORMAT = "eemicrogpt-checkpoint"
VERSION = 3  # 3 added symbols, n_layers and context; 2 added data_sha256 and versions
READABLE_VERSIONS = (1, 2, 3)
LEGACY_CONTEXT = 15  # formats 1-2: rows of 16 tokens, boundaries included
_FLOATS = (np.dtype("<f4"), np.dtype("<f8"))
MAX_META_BYTES = 1 << 20  # the JSON is a few KB; a bigger meta member is not ours
MAX_RECENT_LOSSES = 100_000


@dataclass
class Checkpoint:
    state: TrainState
    total_steps: int
    sampler_state: dict[str, Any]
    config: TrainConfig
    vocab: Vocabulary
    recent_losses: list[float] = field(default_factory=list)
    backend: str = ""
    data_sha256: str = ""  # of the names file's bytes; "" in version 1 files
    versions: dict[str, str] = field(default_factory=dict)  # software that wrote it (informational)
    train_seconds: float = 0.0  # inside the backend's train_steps calls, over every invocation up to this step
    target_reached: TargetReached | None = None
    best: BestSoFar = field(default_factory=BestSoFar)

    @property
    def shape(self) -> ModelShape:
        return self.config.model_shape(self.vocab.size)

    @property
    def finished(self) -> bool:
        """All its steps ran, or it stopped here because it reached its target or ran out of patience (an
        extension trains on)."""
        reached = self.target_reached
        return (self.state.step >= self.total_steps or (reached is not None and self.state.step == reached.stop)
                or self.best.stopped_at == self.state.step)


def software_versions(backend_version: str = "") -> dict[str, str]:
    versions = {"eemicrogpt": __version__, "python": platform.python_version(), "numpy": np.__version__}
    if backend_version:
        versions["backend"] = backend_version
    return versions


def _float_array(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    return x if x.dtype in (np.float32, np.float64) else x.astype(np.float32)


def save_checkpoint(path: Path, ckpt: Checkpoint) -> None:
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "step": int(ckpt.state.step),
        "total_steps": int(ckpt.total_steps),
        "sampler_state": ckpt.sampler_state,
        "config": ckpt.config.to_dict(),
        "recent_losses": [float(x) for x in ckpt.recent_losses],
        "backend": ckpt.backend,
        "data_sha256": ckpt.data_sha256,
        "versions": ckpt.versions,
        "symbols": list(ckpt.vocab.symbols),
        "train_seconds": float(ckpt.train_seconds),
    }
    if ckpt.target_reached is not None:
        r = ckpt.target_reached
        meta["target_reached"] = {"step": r.step, "seconds": float(r.seconds), "stop": r.stop}
    if ckpt.best.val_loss is not None:
        meta["best"] = ckpt.best.as_meta()
    buf = io.BytesIO()
    arrays: dict[str, Any] = {name: _float_array(getattr(ckpt.state, name)) for name in STATE_ARRAYS}
    np.savez(buf, meta=np.array(json.dumps(meta, allow_nan=False)), **arrays)
    atomic_write_bytes(Path(path), buf.getvalue())


def _reject_constant(name: str) -> None:
    raise ValueError(f"non-finite number {name} in the metadata")


def _npy_header(f: IO[bytes], member: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of one .npy member, from its header alone (numpy caps the header's size)."""
    version = np.lib.format.read_magic(f)
    reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _fortran_order, dtype = reader(f)  # 1-D arrays: the order does not matter
    if dtype.hasobject:
        raise CheckpointError(f"{member} holds Python objects, which a checkpoint never does")
    return shape, dtype


def _read_member(zf: zipfile.ZipFile, member: str, expect: tuple[tuple[int, ...], tuple[np.dtype, ...]],
                 describe: str) -> np.ndarray:
    """The array in `member` once its header matches `expect` (shape, dtypes); exactly its bytes are read."""
    with zf.open(member) as f:
        shape, dtype = _npy_header(f, member)
        want_shape, dtypes = expect
        if shape != want_shape or dtype not in dtypes:
            names = " or ".join(d.name for d in dtypes)
            raise CheckpointError(f"{member} has shape {shape} {dtype}, expected {want_shape} {names} {describe}")
        nbytes = dtype.itemsize * math.prod(shape)
        raw = f.read(nbytes)
    if len(raw) != nbytes:
        raise CheckpointError(f"{member} is truncated ({len(raw)} of {nbytes} bytes)")
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def _meta_text(zf: zipfile.ZipFile) -> str:
    if zf.getinfo("meta.npy").file_size > MAX_META_BYTES:
        raise CheckpointError(f"meta.npy declares {zf.getinfo('meta.npy').file_size} bytes, far more than ours")
    with zf.open("meta.npy") as f:
        shape, dtype = _npy_header(f, "meta.npy")
        if shape != () or dtype.kind != "U" or dtype.itemsize > MAX_META_BYTES:
            raise CheckpointError(f"meta.npy has shape {shape} {dtype}, expected one string")
        raw = f.read(dtype.itemsize)
    if len(raw) != dtype.itemsize:
        raise CheckpointError("meta.npy is truncated")
    return str(np.frombuffer(raw, dtype=dtype)[0])


def _int_field(meta: dict[str, Any], key: str) -> int:
    value = meta.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise CheckpointError(f"{key} must be an integer, got {type(value).__name__}")
    return value


def _parse_meta(text: str) -> dict[str, Any]:
    meta = json.loads(text, parse_constant=_reject_constant)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError("not an eemicrogpt checkpoint (no eemicrogpt metadata)")
    version = meta.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise CheckpointError(f"checkpoint version {meta.get('version')!r}; this eemicrogpt reads "
                              f"{', '.join(map(str, READABLE_VERSIONS))} (upgrade eemicrogpt to read it)")
    return meta


def _checked(meta: dict[str, Any]) -> tuple[int, int, dict[str, Any], list[float]]:
    step, total = _int_field(meta, "step"), _int_field(meta, "total_steps")
    if not 1 <= total <= MAX_STEPS:
        raise CheckpointError(f"total_steps {total} is outside 1..{MAX_STEPS}")
    if not 0 <= step <= total:
        raise CheckpointError(f"step {step} is outside 0..{total}")
    sampler_state: Any = meta.get("sampler_state")  # checked just below
    problem = sampler_state_problem(sampler_state)
    if problem is not None:
        raise CheckpointError(f"damaged sampler state ({problem})")
    recent = meta.get("recent_losses", [])
    if not isinstance(recent, list) or len(recent) > MAX_RECENT_LOSSES or not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in recent
    ):
        raise CheckpointError("recent_losses must be a list of finite numbers")
    for key in ("backend", "data_sha256"):
        if not isinstance(meta.get(key, ""), str):
            raise CheckpointError(f"{key} must be a string")
    versions = meta.get("versions", {})
    if not isinstance(versions, dict) or not all(isinstance(v, str) for v in versions.values()):
        raise CheckpointError("versions must map names to strings")
    return step, total, sampler_state, [float(x) for x in recent]


def _seconds_field(value: Any, key: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not (math.isfinite(value) and value >= 0):
        raise CheckpointError(f"{key} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def _target_field(meta: dict[str, Any], step: int) -> TargetReached | None:
    """Where the run reached its target (None: not yet, or no target); the steps must lie within the run's."""
    value = meta.get("target_reached")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise CheckpointError(f"target_reached must be a mapping, got {type(value).__name__}")
    reached, stop = _int_field(value, "step"), _int_field(value, "stop")
    if not 1 <= reached <= stop <= step:
        raise CheckpointError(f"target_reached: steps {reached} and {stop} must satisfy 1 <= step <= stop <= {step}")
    return TargetReached(reached, _seconds_field(value.get("seconds"), "target_reached.seconds"), stop)


def _vocab_field(meta: dict[str, Any], config: TrainConfig) -> Vocabulary:
    symbols = meta.get("symbols")
    if not isinstance(symbols, list) or not all(isinstance(ch, str) for ch in symbols):
        raise CheckpointError("symbols must be a list of characters")
    try:
        return Vocabulary(tuple(symbols), with_boundary=config.data_format != "text")  # the format decides
    except DataError as e:
        raise CheckpointError(f"damaged symbol table ({e})") from None


def _drop_legacy_position(stored: ModelShape, flat: np.ndarray) -> np.ndarray:
    """A format 1-2 buffer without its last pos_emb row (position 15, which no 16-token row could train)."""
    row = stored.offsets["pos_emb"] + LEGACY_CONTEXT * stored.d_model
    return np.delete(flat, np.s_[row : row + stored.d_model])


def _check_members(zf: zipfile.ZipFile) -> None:
    """np.savez writes plain stored (or deflated) members; an encrypted or otherwise compressed one is not ours,
    and zipfile would fail on it with RuntimeError or NotImplementedError."""
    for info in zf.infolist():
        if info.flag_bits & 0x1:
            raise CheckpointError(f"member {info.filename} is encrypted, which a checkpoint never is")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise CheckpointError(f"member {info.filename} uses compression method {info.compress_type}, which a "
                                  "checkpoint never does")


def _read(path: Path) -> Checkpoint:
    fd = open_regular(path, "checkpoint", CheckpointError)
    with os.fdopen(fd, "rb") as f, zipfile.ZipFile(f) as zf:
        _check_members(zf)
        missing = [k for k in ("meta", *STATE_ARRAYS) if f"{k}.npy" not in zf.namelist()]
        if missing:
            raise CheckpointError(f"not an eemicrogpt checkpoint (missing {', '.join(missing)})")
        meta = _parse_meta(_meta_text(zf))
        if not isinstance(meta.get("config"), dict):
            raise CheckpointError("the saved config is missing or not a mapping")
        legacy = meta["version"] < 3
        # Formats 1-2 folded case before their a-z check: a resume folds it too, or a names file with capitals
        # that trained then would now be refused at its first capital.
        saved_config = dict(meta["config"], context=LEGACY_CONTEXT, lowercase=True) if legacy else meta["config"]
        try:
            config = build_config([(f"{path} (saved config)", saved_config)])
        except ConfigError as e:
            raise CheckpointError(str(e)) from None
        vocab = Vocabulary.names() if legacy else _vocab_field(meta, config)
        step, total, sampler_state, recent = _checked(meta)
        try:
            shape = config.model_shape(vocab.size)
        except ValueError as e:
            raise CheckpointError(f"the saved shape is impossible: {e}") from None
        stored = ModelShape(shape.d_model, shape.n_heads, shape.n_layers, shape.vocab, LEGACY_CONTEXT + 1) \
            if legacy else shape
        n = stored.n_params
        describe = f"for {stored.describe()}"
        arrays = {name: _read_member(zf, f"{name}.npy", ((n,), _FLOATS), describe) for name in STATE_ARRAYS}
        if legacy:
            arrays = {name: _drop_legacy_position(stored, a) for name, a in arrays.items()}
    for name, array in arrays.items():
        if not np.all(np.isfinite(array)):
            raise CheckpointError(f"{name} holds non-finite values (the run diverged before this save, or the file "
                                  "was altered); use an earlier copy or train again")
    if np.any(arrays["adam_v"] < 0):
        raise CheckpointError("adam_v holds negative values (it is a mean of squares); the file was altered")
    state = TrainState(arrays["params"], arrays["adam_m"], arrays["adam_v"], step)
    try:
        best = BestSoFar.from_meta(meta.get("best"), step)
    except ValueError as e:
        raise CheckpointError(f"damaged best-loss record: {e}") from None
    return Checkpoint(state, total, sampler_state, config, vocab, recent, meta.get("backend", ""),
                      meta.get("data_sha256", ""), dict(meta.get("versions", {})),
                      _seconds_field(meta.get("train_seconds", 0.0), "train_seconds"), _target_field(meta, step), best)


def load_checkpoint(path: Path) -> Checkpoint:
    path = Path(path)
    try:
        if path.is_file() and path.stat().st_size == 0:
            raise CheckpointError(f"{path}: empty file (0 bytes): the save was cut short; no state to load")
        return _read(path)
    except CheckpointError as e:
        message = str(e)
        raise CheckpointError(message if message.startswith(str(path)) else f"{path}: {message}") from None
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint not found: {path}") from None
    except zipfile.BadZipFile:
        with path.open("rb") as f:
            npy = f.read(6) == b"\x93NUMPY"
        what = "a plain .npy array" if npy else "not a zip archive (truncated, or some other file)"
        raise CheckpointError(f"{path}: unreadable checkpoint: {what}; point at a checkpoint.npz that "
                              "`eemicrogpt train` wrote") from None
    # numpy re-tokenizes a .npy header it cannot parse, and a damaged one can fail there (TokenError).
    except (OSError, ValueError, EOFError, zlib.error, json.JSONDecodeError, RecursionError, tokenize.TokenError) as e:
        raise CheckpointError(f"{path}: unreadable checkpoint ({e})") from None
