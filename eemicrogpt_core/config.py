"""Training configuration: a dataclass, loaded from YAML, overridden by CLI flags, checked key by key.

The dataclass defaults are the built-in default run (the same run as configs/d64.yaml; a test keeps them
equal), so an installed package needs no config file.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError
from .model import ModelShape

DTYPES = ("float32", "float64", "float16")
BACKEND_ENV_VAR = "EEMICROGPT_BACKEND"
DEFAULT_SOURCE = "built-in default"


@dataclass(frozen=True)
class TrainConfig:
    # Default run: d64 for 40,000 steps at lr 0.002, about ten seconds on avx512 here (~240 us/step on a quiet
    # core). Measured on this machine (avx512): this run reached val loss 1.99; d32 for 80k steps (same wall
    # time) 2.02-2.03, d64 for 20k steps at 0.003 2.01. The seed's 0.002 for its longer d64 runs held up.
    d_model: int = 64
    n_heads: int = 4
    batch: int = 16
    steps: int = 40000
    time_budget: float | None = None  # seconds; when set, the steps that fit replace `steps`
    lr: float = 0.002
    seed: int = 42
    backend: str = "auto"
    data: str | None = None  # names file; None: $EEMICROGPT_DATA, else the cached makemore names.txt
    drop_invalid: bool = False  # skip (and count) names with characters outside a-z instead of failing
    val_fraction: float = 0.1
    log_every: int = 1000
    eval_batches: int = 20  # fixed validation batches of `batch` names each
    chunk_steps: int = 250  # steps per backend call: amortises Python overhead
    out: str | None = None  # run directory; None: runs/<time>-d<d_model>
    dtype: str = "float32"
    threads: int | None = None  # threads per step; None: the physical cores available (eemicrogpt_core.threads)

    @property
    def shape(self) -> ModelShape:
        return ModelShape(self.d_model, self.n_heads)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# Hyperparameters per size (configs/dNN.yaml mirror these; a test keeps them equal).
# d16: the seed's bpc@1s row ran ~19,500 steps at lr 0.01.
# d32: 30k steps at 0.005, between the seed's 1-second 0.01 (~6k steps) and its 500k-step 0.002
#   (measured here on avx512: train 1.96, val 2.05).
# d64: the default run above.
# d128: the seed's example (-DD_MODEL=128 -DN_HEADS=8 -DN_STEPS=10000 -DLR=0.003) with the SME2 rows'
#   lower 0.002 (the widest model gets the lower LR; not tuned here).
PRESETS: dict[int, dict[str, Any]] = {
    16: {"d_model": 16, "n_heads": 4, "steps": 20000, "lr": 0.01},
    32: {"d_model": 32, "n_heads": 4, "steps": 30000, "lr": 0.005},
    64: {},
    128: {"d_model": 128, "n_heads": 8, "steps": 10000, "lr": 0.002},
}


def preset(d_model: int) -> TrainConfig:
    if d_model not in PRESETS:
        raise ConfigError(f"no preset for d_model {d_model}; presets: {', '.join(map(str, PRESETS))}")
    return TrainConfig(**PRESETS[d_model])


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "d_model": (int,),
    "n_heads": (int,),
    "batch": (int,),
    "steps": (int,),
    "time_budget": (float, type(None)),
    "lr": (float,),
    "seed": (int,),
    "backend": (str,),
    "data": (str, type(None)),
    "drop_invalid": (bool,),
    "val_fraction": (float,),
    "log_every": (int,),
    "eval_batches": (int,),
    "chunk_steps": (int,),
    "out": (str, type(None)),
    "dtype": (str,),
    "threads": (int, type(None)),
}

_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _coerce(key: str, value: Any, where: str) -> Any:
    """Accept value when its type fits the key (ints count as floats; bools never count as numbers)."""
    allowed = _FIELD_TYPES[key]
    if value is None and type(None) in allowed:
        return None
    if isinstance(value, bool):
        if bool in allowed:
            return value
    elif isinstance(value, int) and (int in allowed or float in allowed):
        return float(value) if int not in allowed else value
    elif isinstance(value, (float, str)) and type(value) in allowed:
        return value
    words = " or ".join(_TYPE_WORDS.get(t, "null") for t in allowed)
    raise ConfigError(f"{where}: {key} must be {words}, got {type(value).__name__} {value!r}")


def _check_values(cfg: TrainConfig, sources: Mapping[str, str]) -> None:
    """Reject impossible values, naming the key and where its value came from."""

    def fail(key: str, msg: str) -> None:
        raise ConfigError(f"{sources.get(key, DEFAULT_SOURCE)}: {key} {msg}")

    for key in ("d_model", "n_heads", "batch", "steps", "log_every", "eval_batches", "chunk_steps"):
        if getattr(cfg, key) < 1:
            fail(key, f"must be >= 1, got {getattr(cfg, key)}")
    if cfg.d_model % cfg.n_heads:
        fail("n_heads", f"must divide d_model {cfg.d_model}, got {cfg.n_heads}")
    if cfg.d_model // cfg.n_heads < 4:
        fail("n_heads", f"leaves head_dim {cfg.d_model // cfg.n_heads} (d_model / n_heads must be >= 4)")
    if not math.isfinite(cfg.lr) or cfg.lr < 0:
        fail("lr", f"must be a finite number >= 0, got {cfg.lr}")
    if cfg.time_budget is not None and not (math.isfinite(cfg.time_budget) and cfg.time_budget > 0):
        fail("time_budget", f"must be a positive number of seconds, got {cfg.time_budget}")
    if cfg.seed < 0:
        fail("seed", f"must be >= 0, got {cfg.seed}")
    if not 0.0 < cfg.val_fraction < 1.0:
        fail("val_fraction", f"must be between 0 and 1 (exclusive), got {cfg.val_fraction}")
    if cfg.threads is not None and cfg.threads < 1:
        fail("threads", f"must be >= 1 (or null for the physical cores), got {cfg.threads}")
    if cfg.dtype not in DTYPES:
        fail("dtype", f"must be one of {', '.join(DTYPES)}, got {cfg.dtype!r}")
    if not cfg.backend.strip():
        fail("backend", "must be a backend name or 'auto', got an empty string")


def build_config(
    layers: list[tuple[str, Mapping[str, Any]]], base: TrainConfig | None = None
) -> TrainConfig:
    """Apply (source, {key: value}) layers in order over base; later layers win. Values None are skipped."""
    values = (base or TrainConfig()).to_dict()
    sources: dict[str, str] = {}
    valid = list(values)
    for source, mapping in layers:
        for key, value in mapping.items():
            if key not in values:
                close = difflib.get_close_matches(str(key), valid, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"{source}: unknown key {key!r}{hint}; valid keys: {', '.join(valid)}")
            values[key] = _coerce(key, value, source)
            sources[key] = source
    cfg = TrainConfig(**values)
    _check_values(cfg, sources)
    return cfg


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping in a YAML config file; malformed YAML names the file and line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(e, "problem", None) or "invalid YAML"
        raise ConfigError(f"{where}: malformed YAML: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys, got {type(data).__name__}")
    return data


def load_config(path: str | Path | None, overrides: Mapping[str, Any] | None = None) -> TrainConfig:
    """The YAML file (or the built-in default) with command-line overrides (None values ignored) on top."""
    layers: list[tuple[str, Mapping[str, Any]]] = []
    if path is not None:
        layers.append((str(path), read_yaml(path)))
    if overrides:
        given = {k: v for k, v in overrides.items() if v is not None}
        layers.append(("command line", given))
    return build_config(layers)


def resolve_backend(flag: str | None, config_value: str, env: Mapping[str, str] = os.environ) -> str:
    """--backend > $EEMICROGPT_BACKEND > the config's backend (default 'auto')."""
    for chosen in (flag, env.get(BACKEND_ENV_VAR)):
        if chosen and chosen.strip():
            return chosen.strip()
    return config_value


def dump_yaml(cfg: TrainConfig) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
