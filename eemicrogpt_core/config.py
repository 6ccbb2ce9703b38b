"""Training configuration: a dataclass, loaded from YAML, overridden by CLI flags, checked key by key.

The dataclass defaults are the built-in default run (the same run as configs/d64.yaml; a test keeps them
equal), so an installed package needs no config file.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .abi import MAX_CONTEXT, MAX_LAYERS
from .errors import ConfigError
from .model import DEFAULT_CONTEXT, ModelShape, default_heads
from .precision import PRECISIONS

DTYPES = ("float32", "float64", "float16")
BACKEND_ENV_VAR = "EEMICROGPT_BACKEND"
DEFAULT_SOURCE = "built-in default"

# Upper bounds, checked before anything is allocated. The C backends serve d_model 16..128; numpy_ref runs any
# width, and 1024 (12.6M parameters) is already far beyond what these CPUs train usefully. Steps: the trainer
# keeps every step's loss of an invocation in memory (4 bytes each), 400 MB at the bound.
MAX_D_MODEL = 1024
MAX_BATCH = 4096
MAX_STEPS = 100_000_000
MAX_CHUNK_STEPS = 10_000
MAX_EVAL_BATCHES = 10_000
MAX_SEED = 2**63 - 1
MAX_TIME_BUDGET = 7 * 24 * 3600.0
MAX_CONFIG_BYTES = 1 << 20  # a config is a few hundred bytes; refuse to parse megabytes


@dataclass(frozen=True)
class TrainConfig:
    # Default run: d64 for 40,000 steps at lr 0.002, about ten seconds on avx512 here (~240 us/step on a quiet
    # core). Measured on this machine (avx512): this run reached val loss 1.99; d32 for 80k steps (same wall
    # time) 2.02-2.03, d64 for 20k steps at 0.003 2.01. The seed's 0.002 for its longer d64 runs held up.
    d_model: int = 64
    n_heads: int = default_heads(64)
    n_layers: int = 1
    context: int = DEFAULT_CONTEXT  # predictions per name (microgpt's block_size); longer names are truncated
    lowercase: bool = False  # fold case before the vocabulary is built
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
    # The matrix products' precision (eemicrogpt_core.precision): None lets `auto` pick fp32 and a named backend
    # run in its own; "bf16"/"fp16" make `auto` pick the best such backend; a named backend must match it.
    precision: str | None = None

    def model_shape(self, vocab: int) -> ModelShape:
        """The model this config trains on data whose vocabulary has `vocab` tokens."""
        return ModelShape(self.d_model, self.n_heads, self.n_layers, vocab, self.context)

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
    16: {"d_model": 16, "n_heads": default_heads(16), "steps": 20000, "lr": 0.01},
    32: {"d_model": 32, "n_heads": default_heads(32), "steps": 30000, "lr": 0.005},
    64: {},
    128: {"d_model": 128, "n_heads": default_heads(128), "steps": 10000, "lr": 0.002},
}


def preset(d_model: int) -> TrainConfig:
    if d_model not in PRESETS:
        raise ConfigError(f"no preset for d_model {d_model}; presets: {', '.join(map(str, PRESETS))}")
    return TrainConfig(**PRESETS[d_model])


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "d_model": (int,),
    "n_heads": (int,),
    "n_layers": (int,),
    "context": (int,),
    "lowercase": (bool,),
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
    "precision": (str, type(None)),
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
    raise ConfigError(f"{where}: {key} must be {words}, got {type(value).__name__} {reprlib.repr(value)}")


def _check_values(cfg: TrainConfig, sources: Mapping[str, str]) -> None:
    """Reject impossible values, naming the key and where its value came from."""

    def fail(key: str, msg: str) -> None:
        raise ConfigError(f"{sources.get(key, DEFAULT_SOURCE)}: {key} {msg}")

    for key in ("d_model", "n_heads", "batch", "steps", "log_every", "eval_batches", "chunk_steps"):
        if getattr(cfg, key) < 1:
            fail(key, f"must be >= 1, got {getattr(cfg, key)}")
    for key, bound in (("d_model", MAX_D_MODEL), ("batch", MAX_BATCH), ("steps", MAX_STEPS),
                       ("log_every", MAX_STEPS), ("eval_batches", MAX_EVAL_BATCHES),
                       ("chunk_steps", MAX_CHUNK_STEPS), ("seed", MAX_SEED)):
        if getattr(cfg, key) > bound:
            fail(key, f"must be <= {bound:,}, got {getattr(cfg, key):,}")
    if cfg.d_model % cfg.n_heads:
        fail("n_heads", f"must divide d_model {cfg.d_model}, got {cfg.n_heads}")
    if cfg.d_model // cfg.n_heads < 4:
        fail("n_heads", f"leaves head_dim {cfg.d_model // cfg.n_heads} (d_model / n_heads must be >= 4)")
    if not math.isfinite(cfg.lr) or cfg.lr < 0:
        fail("lr", f"must be a finite number >= 0, got {cfg.lr}")
    if cfg.time_budget is not None and not (math.isfinite(cfg.time_budget) and 0 < cfg.time_budget <= MAX_TIME_BUDGET):
        fail("time_budget", f"must be a positive number of seconds up to {MAX_TIME_BUDGET:,.0f}, got {cfg.time_budget}")
    if cfg.seed < 0:
        fail("seed", f"must be >= 0, got {cfg.seed}")
    if not 0.0 <= cfg.val_fraction < 1.0:  # also false for NaN
        fail("val_fraction", f"must be in [0, 1) (0: no validation split), got {cfg.val_fraction}")
    if not 1 <= cfg.n_layers <= MAX_LAYERS:
        fail("n_layers", f"must be 1..{MAX_LAYERS}, got {cfg.n_layers}")
    if not 1 <= cfg.context <= MAX_CONTEXT:
        fail("context", f"must be 1..{MAX_CONTEXT}, got {cfg.context}")
    if cfg.threads is not None and cfg.threads < 1:
        fail("threads", f"must be >= 1 (or null for the physical cores), got {cfg.threads}")
    if cfg.dtype not in DTYPES:
        fail("dtype", f"must be one of {', '.join(DTYPES)}, got {cfg.dtype!r}")
    if cfg.precision is not None and cfg.precision not in PRECISIONS:
        fail("precision", f"must be one of {', '.join(PRECISIONS)} (or null), got {cfg.precision!r}")
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


class _Yaml12Resolver(yaml.resolver.BaseResolver):
    """YAML 1.2 core-schema scalars instead of PyYAML's YAML 1.1: `1e-3` is a number, `yes`/`on` are strings,
    and the 1.1 readings that silently change a value (`1:30` as 90, `010` as octal 8) are refused."""


_INT = r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+"
_FLOAT = r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)"
_AMBIGUOUS = r"[-+]?0[0-9]+|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?|[-+]?0b[01_]+|[-+]?[0-9]+(?:_[0-9]+)+"
_AMBIGUOUS_TAG = "tag:eemicrogpt,2026:yaml11-number"
for _tag, _pattern, _first in (
    ("tag:yaml.org,2002:bool", r"true|True|TRUE|false|False|FALSE", "tTfF"),
    ("tag:yaml.org,2002:null", r"~|null|Null|NULL|", ["~", "n", "N", ""]),
    (_AMBIGUOUS_TAG, _AMBIGUOUS, "-+0123456789"),
    ("tag:yaml.org,2002:int", _INT, "-+0123456789"),
    ("tag:yaml.org,2002:float", _FLOAT, "-+0123456789.n"),
):
    _Yaml12Resolver.add_implicit_resolver(_tag, re.compile(rf"^(?:{_pattern})$"), list(_first))


class _ConfigLoader(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, yaml.composer.Composer,
                    yaml.constructor.SafeConstructor, _Yaml12Resolver):
    """SafeLoader with YAML 1.2 scalars and no aliases (an alias bomb expands to billions of nodes)."""

    def __init__(self, stream: str) -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        _Yaml12Resolver.__init__(self)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.events.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed in a config; write "
                                              "the value out", event.start_mark)
        return super().compose_node(parent, index)

    def construct_ambiguous(self, node: yaml.ScalarNode) -> Any:
        raise yaml.constructor.ConstructorError(
            None, None, f"{node.value!r} reads differently in YAML 1.1 and 1.2 (1:30 is 90, 010 is 8, 1_0 is "
            "10 in 1.1); write the plain decimal number you mean, or quote it for a string", node.start_mark)


_ConfigLoader.add_constructor(_AMBIGUOUS_TAG, _ConfigLoader.construct_ambiguous)


class _ConfigDumper(yaml.emitter.Emitter, yaml.serializer.Serializer, yaml.representer.SafeRepresenter,
                    _Yaml12Resolver):
    """SafeDumper that quotes exactly the strings _ConfigLoader would read as something else."""

    def __init__(self, stream: Any, **kwargs: Any) -> None:
        yaml.emitter.Emitter.__init__(self, stream, canonical=kwargs.get("canonical"), indent=kwargs.get("indent"),
                                      width=kwargs.get("width"), allow_unicode=kwargs.get("allow_unicode"),
                                      line_break=kwargs.get("line_break"))
        yaml.serializer.Serializer.__init__(self, encoding=kwargs.get("encoding"),
                                            explicit_start=kwargs.get("explicit_start"),
                                            explicit_end=kwargs.get("explicit_end"), version=kwargs.get("version"),
                                            tags=kwargs.get("tags"))
        yaml.representer.SafeRepresenter.__init__(self, default_style=kwargs.get("default_style"),
                                                  default_flow_style=kwargs.get("default_flow_style", False),
                                                  sort_keys=kwargs.get("sort_keys", True))
        _Yaml12Resolver.__init__(self)


def parse_yaml(text: str) -> Any:
    """A config document under the rules of _ConfigLoader."""
    loader = _ConfigLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping in a YAML config file; malformed YAML names the file and line."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: {path.stat().st_size:,} bytes is far too big for a config file")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from None
    try:
        data = parse_yaml(text)
    except RecursionError:
        raise ConfigError(f"{path}: malformed YAML: nested too deeply") from None
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
    return yaml.dump(cfg.to_dict(), Dumper=_ConfigDumper, sort_keys=False)
