"""Training configuration: one schema (the TrainConfig fields), loaded from YAML, overridden by CLI flags, checked
key by key.

Each key is written once, as a TrainConfig field: its type is the annotation, its default the field's default,
and its bounds, help text and CLI spelling are the field's `Setting`. The YAML loader, the checks, the error
messages and the `eemicrogpt train` options (cli.py) are all derived from the fields, so adding a key means
adding one field.

The dataclass defaults are the built-in default run (the same run as the shipped d64.yaml; a test keeps them
equal), so an installed package needs no config file.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import reprlib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..backends.precision import PRECISIONS
from ..base.abi import MAX_CONTEXT, MAX_LAYERS
from ..base.errors import ConfigError
from ..base.reading import read_regular_bytes
from ..base.shipped import find
from ..model.optim import DEFAULT_OPTIMIZER, LR_SCHEDULES, LrSchedule, OptimizerSettings
from ..model.shape import DEFAULT_CONTEXT, NAMES_VOCAB, ModelShape, ShapeError, default_heads
from .target import TARGET_METRICS

DTYPES = ("float32", "float64", "float16")
DATA_FORMATS = ("lines", "text")  # lines: one name (item) per line; text: one stream of characters (data/text.py)
BACKEND_ENV_VAR = "EEMICROGPT_BACKEND"
DEFAULT_SOURCE = "built-in default"

# Upper bounds, checked before anything is allocated. A native backend serves the widths its library declares
# (emg_supports; `eemicrogpt backends` shows each envelope, at most 256 today); numpy_ref runs any width, and
# 1024 (12.6M parameters) is already far beyond what these CPUs train usefully. Steps: the trainer keeps every
# step's loss of an invocation in memory (4 bytes each), 400 MB at the bound.
MAX_D_MODEL = 1024
# The largest batch a config may ask for (numpy_ref takes all of it; a native session at most abi.MAX_NATIVE_BATCH).
MAX_CONFIG_BATCH = 4096
MAX_STEPS = 100_000_000
MAX_CHUNK_STEPS = 10_000
MAX_EVAL_BATCHES = 10_000
MAX_SEED = 2**63 - 1
MAX_TIME_BUDGET = 7 * 24 * 3600.0
MAX_CONFIG_BYTES = 1 << 20  # a config is a few hundred bytes; refuse to parse megabytes

# Hyperparameters per size (the shipped eemicrogpt_core/configs/dNN.yaml mirror these; a test keeps them equal).
# A run of one of these widths gets its preset for every value that neither the command line nor the config
# file gives (load_config).
# d16: the seed's bpc@1s row ran ~19,500 steps at lr 0.01.
# d32: 30k steps at 0.005, between the seed's 1-second 0.01 (~6k steps) and its 500k-step 0.002
#   (measured on avx512: train 1.96, val 2.05).
# d64: the default run (TrainConfig's defaults).
# d128: the seed's example (-DD_MODEL=128 -DN_HEADS=8 -DN_STEPS=10000 -DLR=0.003) with the SME2 rows'
#   lower 0.002 (the widest model gets the lower LR; not tuned).
PRESETS: dict[int, dict[str, Any]] = {
    16: {"d_model": 16, "n_heads": default_heads(16), "steps": 20000, "lr": 0.01},
    32: {"d_model": 32, "n_heads": default_heads(32), "steps": 30000, "lr": 0.005},
    64: {},
    128: {"d_model": 128, "n_heads": default_heads(128), "steps": 10000, "lr": 0.002},
}


@dataclass(frozen=True)
class Setting:
    """What a config key accepts beyond its type (the field's annotation), and how the command line offers it.

    Bounds apply to numbers; choices to strings. Errors read "SOURCE: KEY must be ...".
    """

    help: str
    minimum: float | None = None
    maximum: float | None = None
    open_minimum: bool = False  # the minimum itself is refused (floats only)
    open_maximum: bool = False  # the maximum itself is refused (floats only)
    choices: tuple[str, ...] | None = None
    null_means: str | None = None  # what null stands for, said in errors: "(or null for ...)"
    null_word: str | None = None  # a string a config file may write for null (threads: auto)
    check: Callable[[Any], str | None] | None = None  # a rule bounds cannot say: the problem ("must ..."), or None
    flag: str | None = None  # the CLI option when not --key-with-dashes
    on_resume: bool = False  # `train --resume` may change it (the rest is the saved run's)
    switch: tuple[str, str] | None = None  # (flag, value): a CLI flag that sets the key to value (--text)


_SETTING = "eemicrogpt.setting"


def _key(default: Any, help: str, **rules: Any) -> Any:
    """A TrainConfig field: its default and its Setting."""
    return dataclasses.field(default=default, metadata={_SETTING: Setting(help, **rules)})


LOG_SINKS = ("tensorboard", "wandb")  # sinks.py writes them


def sink_names(value: str | None) -> list[str]:
    """The sinks a `log_to` value names ("tensorboard", "wandb" or both, comma-separated)."""
    return [] if not value else list(dict.fromkeys(part.strip() for part in value.split(",") if part.strip()))


def _log_to_problem(value: str) -> str | None:
    names = sink_names(value)
    if not names or any(n not in LOG_SINKS for n in names):
        return f"must name {' and/or '.join(LOG_SINKS)} (comma-separated), got {value!r}"
    return None


def _named_backend(value: str) -> str | None:
    return None if value.strip() else "must be a backend name or 'auto', got an empty string"


# The optimiser's keys and the OptimizerSettings field each one sets; optim.py rules on their values, so the
# config, the C ABI's emg_set_optimizer and every backend refuse the same values.
OPTIMIZER_KEYS = {"weight_decay": "weight_decay", "adam_beta1": "beta1", "adam_beta2": "beta2", "adam_eps": "eps",
                  "grad_clip": "grad_clip"}


def _optimizer_rule(key: str) -> Callable[[Any], str | None]:
    """The check of one optimiser key: OptimizerSettings.problem with the other settings at their defaults."""
    field = OPTIMIZER_KEYS[key]

    def check(value: Any) -> str | None:
        problem = dataclasses.replace(DEFAULT_OPTIMIZER, **{field: value}).problem()
        return problem[1] if problem else None

    return check


def _optimizer_key(key: str, help: str) -> Any:
    return _key(getattr(DEFAULT_OPTIMIZER, OPTIMIZER_KEYS[key]), help, check=_optimizer_rule(key))


@dataclass(frozen=True)
class TrainConfig:
    # Default run: d64 for 40,000 steps at lr 0.002, the seed's rate for its longer d64 runs (docs/benchmarks.md
    # has its measured loss and speed).
    # The model's keys (d_model, n_heads, n_layers, context) are checked together by ModelShape (_check_values);
    # their Settings hold only what ModelShape does not rule on.
    d_model: int = _key(64, f"model width; {', '.join(f'd{d}' for d in PRESETS)} bring their preset "
                        "(lr, steps, heads) for the values not given", maximum=MAX_D_MODEL)
    n_heads: int = _key(default_heads(64), "attention heads (must divide d_model, head size >= 4)")
    n_layers: int = _key(1, f"transformer blocks, 1..{MAX_LAYERS}")
    context: int = _key(DEFAULT_CONTEXT, f"predictions per name or text window (microgpt's block_size), "
                        f"1..{MAX_CONTEXT}; longer names are truncated")
    batch: int = _key(16, "names (or text windows) per step", minimum=1, maximum=MAX_CONFIG_BATCH)
    steps: int = _key(40000, "training steps (the LR schedule spans them)", minimum=1, maximum=MAX_STEPS)
    time_budget: float | None = _key(  # seconds; when set, the steps that fit replace `steps`
        None, "seconds of training (measured by a short warm-up first); the steps that fit replace --steps",
        minimum=0.0, open_minimum=True, maximum=MAX_TIME_BUDGET)
    # target.py says exactly which step and which seconds count (first_reached, seconds_within).
    target_loss: float | None = _key(
        None, "stop once the train loss (mean of the last 100 steps, as printed), or with --target-metric val the "
        "validation loss, is <= this; the run records "
        "the steps and training seconds it took (--steps or --time-budget still caps the run)",
        minimum=0.0, open_minimum=True, null_means="no target")
    target_metric: str = _key("train", "which loss target_loss watches: train (the running mean, checked every step) "
                              "or val (the validation loss, checked every --log-every steps)", choices=TARGET_METRICS)
    lr: float = _key(0.002, "peak learning rate (the first step's without warm-up)", minimum=0.0)
    # The defaults (linear to zero, no warm-up) are the schedule every earlier run used, to the bit (optim.py).
    lr_schedule: str = _key("linear", f"decay after the warm-up: {' or '.join(LR_SCHEDULES)}, from lr to min_lr "
                            "over the remaining steps", choices=LR_SCHEDULES)
    warmup_steps: int = _key(0, "steps over which the learning rate ramps linearly up to lr (fewer than --steps)",
                             minimum=0, maximum=MAX_STEPS)
    min_lr: float = _key(0.0, "learning rate the decay ends at (at most lr)", minimum=0.0)
    # AdamW (optim.py's OptimizerSettings). The defaults are the original Adam, to the bit, and a backend session
    # sees nothing new unless one of these differs from its default.
    weight_decay: float = _optimizer_key("weight_decay", "decoupled weight decay (AdamW): each step multiplies "
                                         "every tensor by 1 - lr * weight_decay before Adam's update; 0 is none")
    adam_beta1: float = _optimizer_key("adam_beta1", "Adam's beta1 (first-moment decay), in [0, 1)")
    adam_beta2: float = _optimizer_key("adam_beta2", "Adam's beta2 (second-moment decay), in [0, 1)")
    adam_eps: float = _optimizer_key("adam_eps", "Adam's eps (added to the root of the second moment), > 0")
    grad_clip: float = _optimizer_key("grad_clip", "clip the gradient to this global L2 norm (all tensors "
                                      "together) before Adam; 0 is none")
    seed: int = _key(42, "seed of init, split and batches", minimum=0, maximum=MAX_SEED)
    backend: str = _key("auto", "backend name or 'auto' (precedence: this flag > $EEMICROGPT_BACKEND > config > "
                        "auto)", check=_named_backend, on_resume=True)
    data_format: str = _key("lines", "lines: one item (a name) per line, each a sequence of its own; text: the file "
                            "is one stream of characters, trained on in windows of context + 1 (--text)",
                            choices=DATA_FORMATS, switch=("--text", "text"))
    data: str | None = _key(None, "data file (precedence: this flag > $EEMICROGPT_DATA, or $EEMICROGPT_TEXT_DATA for "
                            "a text > config > the format's default, cached: makemore names.txt or tiny Shakespeare)",
                            on_resume=True)
    drop_invalid: bool = _key(False, "skip (and count) lines with a control character, or on --resume a character "
                              "outside the run's vocabulary, instead of failing", on_resume=True)
    lowercase: bool = _key(False, "fold upper case to lower case before the vocabulary is built")
    val_fraction: float = _key(0.1, "share of the names (or of a text's last characters) held out for "
                               "validation, in [0, 1) (0: no validation)",
                               minimum=0.0, maximum=1.0, open_maximum=True)
    keep_best: bool = _key(False, "also keep best.npz, the checkpoint of the lowest validation loss so far (sample, "
                           "export and load take it with --best / best=True)")
    patience: int | None = _key(None, "stop after this many validation rounds (every --log-every steps) in a row "
                                "without a lower validation loss", minimum=1, null_means="never stop early")
    log_to: str | None = _key(None, "also log the metrics to tensorboard (event files in RUN/tensorboard) and/or wandb "
                              "(offline unless $WANDB_MODE says otherwise; RUN/wandb), comma-separated; "
                              "metrics.jsonl is always written", check=_log_to_problem, null_means="metrics.jsonl only",
                              on_resume=True)
    log_every: int = _key(1000, "steps between log lines, val loss and checkpoints", minimum=1, maximum=MAX_STEPS)
    sample_every: int | None = _key(None, "also print a sample (ten names, or 200 characters of a text) at the log "
                                    "lines whose step is a multiple of this (a multiple of log_every)", minimum=1,
                                    maximum=MAX_STEPS, null_means="never", on_resume=True)
    eval_batches: int = _key(20, "fixed validation batches of `batch` names (or text "
                             "windows) each", minimum=1,
                             maximum=MAX_EVAL_BATCHES)
    chunk_steps: int = _key(250, "steps per backend call (amortises Python overhead)", minimum=1,
                            maximum=MAX_CHUNK_STEPS)
    out: str | None = _key(None, "run directory (default runs/<time>-d<d_model>)")
    dtype: str = _key("float32", f"the session's arithmetic: {', '.join(DTYPES)} (each backend declares the ones it "
                      "runs; all run float32)", choices=DTYPES)
    threads: int | None = _key(None, "threads per step (default: auto, chosen and re-chosen from measured step "
                               "times where the backend's results do not depend on the count; else the physical "
                               "cores)", minimum=1, null_means="auto", null_word="auto", on_resume=True)
    # The matrix products' precision (backends.precision): None lets `auto` pick fp32 and a named backend
    # run in its own; "bf16"/"fp16" make `auto` pick the best such backend; a named backend must match it.
    precision: str | None = _key(None, f"matrix-product precision: {', '.join(PRECISIONS)} (default: auto picks "
                                 "fp32, a named backend runs in its own; reduced precision is never picked unless "
                                 "asked for)", choices=PRECISIONS)

    def model_shape(self, vocab: int) -> ModelShape:
        """The model this config trains on data whose vocabulary has `vocab` tokens."""
        return ModelShape(self.d_model, self.n_heads, self.n_layers, vocab, self.context)

    def schedule(self) -> LrSchedule:
        """The learning-rate schedule of this run (the steps it spans are the trainer's to say)."""
        return LrSchedule(self.lr, self.lr_schedule, self.warmup_steps, self.min_lr)

    def optimizer(self) -> OptimizerSettings:
        """The optimiser of this run (DEFAULT_OPTIMIZER unless an optimiser key says otherwise)."""
        return OptimizerSettings(**{field: getattr(self, key) for key, field in OPTIMIZER_KEYS.items()})

    def optimizer_changes(self) -> list[str]:
        """The optimiser keys that differ from their defaults, as "key value" (for the start-up summary and
        errors)."""
        return [f"{key} {getattr(self, key):g}" for key, field in OPTIMIZER_KEYS.items()
                if getattr(self, key) != getattr(DEFAULT_OPTIMIZER, field)]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _types_of(hint: Any) -> tuple[type, ...]:
    """The types a value of a field's annotation may have: `float | None` -> (float, NoneType)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return typing.get_args(hint)
    return (hint,)


def settings_of(cls: type) -> dict[str, Setting]:
    """Each field's Setting, in field order; a field declared without one is a programming error."""
    out = {}
    for f in dataclasses.fields(cls):
        if _SETTING not in f.metadata:
            raise TypeError(f"{cls.__name__}.{f.name} has no Setting: declare it with _key(default, help, ...)")
        out[f.name] = f.metadata[_SETTING]
    return out


# The schema, derived from the fields: every key's Setting and the types its value may have.
SETTINGS: dict[str, Setting] = settings_of(TrainConfig)
FIELD_TYPES: dict[str, tuple[type, ...]] = {
    key: _types_of(hint) for key, hint in typing.get_type_hints(TrainConfig).items()
}
KEYS = tuple(SETTINGS)


def preset(d_model: int) -> TrainConfig:
    if d_model not in PRESETS:
        raise ConfigError(f"no preset for d_model {d_model}; presets: {', '.join(map(str, PRESETS))}")
    return TrainConfig(**PRESETS[d_model])


TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _coerce(key: str, value: Any, where: str) -> Any:
    """Accept value when its type fits the key (ints count as floats; bools never count as numbers)."""
    allowed = FIELD_TYPES[key]
    if value is not None and value == SETTINGS[key].null_word:
        value = None
    if value is None and type(None) in allowed:
        return None
    if isinstance(value, bool):
        if bool in allowed:
            return value
    elif isinstance(value, int) and (int in allowed or float in allowed):
        return float(value) if int not in allowed else value
    elif isinstance(value, (float, str)) and type(value) in allowed:
        return value
    words = " or ".join(TYPE_WORDS.get(t, "null") for t in allowed)
    raise ConfigError(f"{where}: {key} must be {words}, got {type(value).__name__} {reprlib.repr(value)}")


def _or_null(key: str, setting: Setting) -> str:
    if type(None) not in FIELD_TYPES[key]:
        return ""
    if setting.null_word:
        return f" (or {setting.null_word})"
    return f" (or null for {setting.null_means})" if setting.null_means else " (or null)"


def _float_problem(value: float, s: Setting) -> str | None:
    low_ok = s.minimum is None or (value > s.minimum if s.open_minimum else value >= s.minimum)
    high_ok = s.maximum is None or (value < s.maximum if s.open_maximum else value <= s.maximum)
    if math.isfinite(value) and low_ok and high_ok:  # NaN fails isfinite
        return None
    if s.minimum is not None and s.maximum is not None:
        interval = f"{'(' if s.open_minimum else '['}{s.minimum:,g}, {s.maximum:,g}{')' if s.open_maximum else ']'}"
        return f"must be a finite number in {interval}, got {value}"
    if s.minimum is not None:
        return f"must be a finite number {'>' if s.open_minimum else '>='} {s.minimum:,g}, got {value}"
    if s.maximum is not None:
        return f"must be a finite number {'<' if s.open_maximum else '<='} {s.maximum:,g}, got {value}"
    return f"must be a finite number, got {value}"


def _problem(key: str, value: Any) -> str | None:
    """What is wrong with a value of the right type for key, by the key's Setting (None: nothing)."""
    s = SETTINGS[key]
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, float):
        problem = _float_problem(value, s)
        if problem:
            return problem
    elif isinstance(value, int):
        if s.minimum is not None and value < s.minimum:
            return f"must be >= {s.minimum:,}{_or_null(key, s)}, got {value:,}"
        if s.maximum is not None and value > s.maximum:
            return f"must be <= {s.maximum:,}, got {value:,}"
    elif isinstance(value, str) and s.choices is not None and value not in s.choices:
        return f"must be one of {', '.join(s.choices)}{_or_null(key, s)}, got {value!r}"
    return s.check(value) if s.check is not None else None


def _check_values(cfg: TrainConfig, sources: Mapping[str, str]) -> None:
    """Reject impossible values, naming the key and where its value came from."""

    def fail(key: str, msg: str) -> None:
        raise ConfigError(f"{sources.get(key, DEFAULT_SOURCE)}: {key} {msg}")

    def other(key: str, value: str, blamed: str) -> str:
        """key's value for a check between two keys, and where it was given when that is not where `blamed`'s
        was (a --steps flag against a config file's warmup_steps)."""
        given_in = sources.get(key)
        return f"{key} ({value}{', from ' + given_in if given_in and given_in != sources.get(blamed) else ''})"

    for key in KEYS:
        problem = _problem(key, getattr(cfg, key))
        if problem:
            fail(key, problem)
    for key in ("keep_best", "patience"):
        if getattr(cfg, key) not in (None, False) and cfg.val_fraction == 0:
            fail(key, "needs a validation split: val_fraction must be above 0")
    if cfg.target_metric == "val" and cfg.target_loss is not None and cfg.val_fraction == 0:
        fail("target_metric", "val needs a validation split: val_fraction must be above 0")
    if cfg.min_lr > cfg.lr:
        fail("min_lr", f"must be at most {other('lr', f'{cfg.lr:g}', 'min_lr')}, got {cfg.min_lr:g}")
    if cfg.sample_every is not None and cfg.sample_every % cfg.log_every:
        fail("sample_every", f"must be a multiple of {other('log_every', f'{cfg.log_every:,}', 'sample_every')}: "
             f"samples are drawn at log lines, got {cfg.sample_every:,}")
    if cfg.time_budget is None and cfg.warmup_steps >= cfg.steps:
        fail("warmup_steps", f"must be fewer than {other('steps', f'{cfg.steps:,}', 'warmup_steps')}, "
             f"got {cfg.warmup_steps:,}")
    try:  # the model's rules; any valid vocabulary will do, since the data decides it and no key sets it
        cfg.model_shape(NAMES_VOCAB)
    except ShapeError as e:
        # A default at fault is blamed on the given shape key it clashes with (d_model: 30 leaves 4 heads wrong).
        given = [sources[f.name] for f in dataclasses.fields(ModelShape) if f.name in sources]
        source = sources.get(e.key) or (given[-1] if given else DEFAULT_SOURCE)
        raise ConfigError(f"{source}: {e.key} {e.problem}") from None


def build_config(
    layers: Sequence[tuple[str, Mapping[str, Any]]], base: TrainConfig | None = None
) -> TrainConfig:
    """Apply (source, {key: value}) layers in order over base; later layers win. Values None are skipped."""
    values = (base or TrainConfig()).to_dict()
    sources: dict[str, str] = {}
    for source, mapping in layers:
        for key, value in mapping.items():
            if key not in values:
                close = difflib.get_close_matches(str(key), KEYS, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"{source}: unknown key {key!r}{hint}; valid keys: {', '.join(KEYS)}")
            values[key] = _coerce(key, value, source)
            sources[key] = source
    cfg = TrainConfig(**values)
    _check_values(cfg, sources)
    return cfg


def _preset_layer(layers: Sequence[tuple[str, Mapping[str, Any]]]) -> list[tuple[str, Mapping[str, Any]]]:
    """The preset of the width the layers choose (the last d_model given, else the default's), as a layer."""
    d_model = TrainConfig().d_model
    for _, mapping in layers:
        value = mapping.get("d_model")
        if isinstance(value, int) and not isinstance(value, bool):
            d_model = value
    return [(f"d{d_model} preset", PRESETS[d_model])] if PRESETS.get(d_model) else []


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

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """A key given twice is refused, naming both lines (PyYAML would keep the last one silently)."""
        seen: dict[Any, int] = {}
        for key_node, _value in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                key = key_node.value
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} is given twice (lines {seen[key]} and {line}); keep one",
                        key_node.start_mark)
                seen[key] = line
        return super().construct_mapping(node, deep)

    def construct_ambiguous(self, node: yaml.ScalarNode) -> Any:
        raise yaml.constructor.ConstructorError(
            None, None, f"{node.value!r} reads differently in YAML 1.1 and 1.2 (1:30 is 90, 010 is 8, 1_0 is "
            "10 in 1.1); write the plain decimal number you mean, or quote it for a string", node.start_mark)


# The stubs accept only PyYAML's own loader classes here; _ConfigLoader is assembled from the same parts.
_ConfigLoader.add_constructor(_AMBIGUOUS_TAG, _ConfigLoader.construct_ambiguous)  # type: ignore[type-var]


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


def read_yaml(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """The mapping in a YAML file (`what`: a config file, a sweep spec), read only from a regular file of at
    most MAX_CONFIG_BYTES; malformed YAML (a key given twice included) names the file and line."""
    path = Path(path)
    try:
        text = read_regular_bytes(path, what, MAX_CONFIG_BYTES, ConfigError).decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"cannot read {what} {path}: {e}") from None
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


def load_config(path: str | Path | None, overrides: Mapping[str, Any] | None = None,
                what: str = "--config", overrides_source: str = "command line") -> TrainConfig:
    """The run a user asks for: command-line overrides (None values ignored) > the YAML file (a path, or the name
    of a shipped config: d16) > the chosen width's preset > the built-in default. `what` names the file's
    option in errors, overrides_source the overrides (the API's "train() keys")."""
    layers: list[tuple[str, Mapping[str, Any]]] = []
    if path is not None:
        path = find(path, "config", what)
        layers.append((str(path), read_yaml(path)))
    if overrides:
        given = {k: v for k, v in overrides.items() if v is not None}
        layers.append((overrides_source, given))
    return build_config(_preset_layer(layers) + layers)


def resolve_backend(flag: str | None, config_value: str, env: Mapping[str, str] = os.environ) -> str:
    """--backend > $EEMICROGPT_BACKEND > the config's backend (default 'auto')."""
    for chosen in (flag, env.get(BACKEND_ENV_VAR)):
        if chosen and chosen.strip():
            return chosen.strip()
    return config_value


def dump_yaml(cfg: TrainConfig) -> str:
    return yaml.dump(cfg.to_dict(), Dumper=_ConfigDumper, sort_keys=False)
