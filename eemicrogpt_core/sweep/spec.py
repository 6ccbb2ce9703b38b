"""A sweep spec: a base config plus what varies (grid, random draws, seeds), expanded into named runs.

The YAML shape borrows from W&B sweep configs and Hydra multirun, which users already know:

    name: bpc1s                 # optional; the default sweep directory is sweeps/<name>
    base: {d_model: 64, batch: 16, backend: auto}   # any training key (the config file's names)
    grid: {d_model: [16, 32], lr: 0.003,0.01}        # every combination (Hydra's multirun; its a,b,c too)
    # a grid key whose values are mappings links keys: size: [{d_model: 16, steps: 40000}, {d_model: 64, ...}]
    random:                                          # draws shared by every grid point (W&B's random method)
      count: 4
      seed: 0
      parameters:
        lr: {distribution: log_uniform, min: 0.001, max: 0.03}
        batch: {values: [16, 32]}
    seeds: [1, 2]               # every combination above is trained once per seed
    time_budget: 1.0            # or steps: 2000 (per run; shorthand for base keys)

A W&B sweep config (`method: grid|random`, `parameters: {key: {values|value|distribution, min, max}}`,
`run_cap`) is read too, translated to this shape (W&B's `log_uniform` takes natural-log bounds, as there).

Every key that varies must be a training key; `out` is the sweep's own business. Every resolved run config is
checked with the trainer's own rules before anything starts, so a bad spec fails in one line up front.
"""

from __future__ import annotations

import difflib
import itertools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
import yaml

from ..base.errors import ConfigError
from ..base.shipped import find
from ..training.config import KEYS, TrainConfig, build_config, read_yaml

TOP_KEYS = ("name", "base", "grid", "random", "seeds", "steps", "time_budget")
RANDOM_KEYS = ("count", "seed", "parameters")
TRAINING_KEYS = KEYS
SWEEP_OWNED = ("out",)  # each run's directory is chosen by the sweep
LOG_UNIFORM = ("log_uniform", "log_uniform_values")  # W&B's name for bounds given as values
SIGNIFICANT_DIGITS = 4  # random draws are rounded so run names and tables stay readable
# Runs one spec may expand to, counted before any is built: each is a run directory and a results row, and
# ten thousand runs of one second each already take hours on a small machine.
MAX_RUNS = 10_000


@dataclass(frozen=True)
class Run:
    run_id: str  # stable across re-runs of the same spec: the directory name under runs/
    varied: dict[str, Any]  # the keys this sweep varies, with this run's values
    config: TrainConfig  # out is not set yet (the sweep directory decides it)


@dataclass(frozen=True)
class SweepSpec:
    name: str
    source: str
    base: dict[str, Any]
    grid: dict[str, list[Any]]
    random_count: int
    random_seed: int
    random_params: dict[str, dict[str, Any]]
    seeds: list[int] | None

    @property
    def varied_keys(self) -> list[str]:
        keys = list(_flat({k: v[0] for k, v in self.grid.items()})) + list(self.random_params)
        return [*keys, "seed"] if self.seeds is not None else keys

    def resolved(self) -> dict[str, Any]:
        """The spec with defaults filled in, as written to the sweep directory (and compared on re-runs)."""
        out: dict[str, Any] = {"name": self.name, "base": self.base, "grid": self.grid}
        if self.random_params:
            out["random"] = {"count": self.random_count, "seed": self.random_seed, "parameters": self.random_params}
        if self.seeds is not None:
            out["seeds"] = self.seeds
        return out


def _fail(where: str, message: str) -> ConfigError:
    return ConfigError(f"{where}: {message}")


def _check_training_key(where: str, key: Any) -> None:
    if key in SWEEP_OWNED:
        raise _fail(where, f"{key!r} cannot be set in a sweep (each run's directory is <sweep dir>/runs/<run id>)")
    if key not in TRAINING_KEYS:
        close = difflib.get_close_matches(str(key), TRAINING_KEYS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise _fail(where, f"{key!r} is not a training key{hint}; training keys: {', '.join(TRAINING_KEYS)}")


def _mapping(where: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(where, f"expected a mapping, got {type(value).__name__} {value!r}")
    return value


def _parse_distribution(where: str, spec: Any) -> dict[str, Any]:
    if not isinstance(spec, dict):
        shapes = "{values: [...]} or {distribution: log_uniform|uniform, min, max}"
        raise _fail(where, f"expected {shapes}, got {spec!r}")
    if "values" in spec:
        if set(spec) != {"values"}:
            raise _fail(where, "a choice takes only 'values'")
        values = spec["values"]
        if not isinstance(values, list) or not values:
            raise _fail(where, "'values' must be a non-empty list")
        return {"values": values}
    unknown = set(spec) - {"distribution", "min", "max"}
    if unknown:
        raise _fail(where, f"unknown keys {sorted(unknown)}; expected distribution, min, max (or values)")
    dist = spec.get("distribution")
    if dist not in (*LOG_UNIFORM, "uniform"):
        raise _fail(where, f"distribution must be log_uniform or uniform, got {dist!r}")
    lo, hi = spec.get("min"), spec.get("max")
    if not (_finite_number(lo) and _finite_number(hi)):
        raise _fail(where, f"min and max must be finite numbers, got {lo!r} and {hi!r}")
    if not lo < hi:
        raise _fail(where, f"min must be below max, got {lo} and {hi}")
    if dist in LOG_UNIFORM and lo <= 0:
        raise _fail(where, f"a log-uniform range needs min > 0, got {lo}")
    return {"distribution": "log_uniform" if dist in LOG_UNIFORM else "uniform", "min": lo, "max": hi}


WANDB_KEYS = ("method", "parameters", "run_cap", "name", "description", "metric", "program", "project")


def from_wandb(data: Mapping[str, Any], source: str) -> dict[str, Any]:
    """A W&B sweep config as this module's spec: grid values -> grid, fixed values -> base, the rest random."""
    unknown = [k for k in data if k not in WANDB_KEYS]
    if unknown:
        raise _fail(source, f"unknown key {unknown[0]!r} in a W&B-style spec (method: ...); expected "
                    f"{', '.join(WANDB_KEYS)}")
    method = data["method"]
    if method not in ("grid", "random"):
        raise _fail(f"{source}: method", f"must be grid or random, got {method!r}")
    out: dict[str, Any] = {"name": data["name"]} if "name" in data else {}
    base, grid, params = {}, {}, {}
    for key, p in _mapping(f"{source}: parameters", data.get("parameters")).items():
        where = f"{source}: parameters.{key}"
        p = _mapping(where, p)
        if "value" in p:
            base[key] = p["value"]
        elif method == "grid":
            if "values" not in p:
                raise _fail(where, "a grid sweep takes 'values' (or 'value') for every parameter")
            grid[key] = p["values"]
        elif p.get("distribution") == "log_uniform":  # W&B: bounds are natural logs
            params[key] = {**p, "distribution": "log_uniform_values",
                           **{b: math.exp(p[b]) for b in ("min", "max") if isinstance(p.get(b), (int, float))}}
        else:
            params[key] = p
    out.update(base=base, grid=grid)
    if params:
        if "run_cap" not in data:  # W&B draws until stopped; one silent run would not be what was meant
            raise _fail(f"{source}: run_cap", "a random W&B-style sweep needs run_cap: N (how many runs to draw); "
                        "W&B itself would draw until stopped")
        out["random"] = {"count": data["run_cap"], "parameters": params}
    return out


def _check_group(where: str, values: list[dict[str, Any]]) -> None:
    """A linked grid key: each value sets several training keys together (e.g. d_model with its steps)."""
    keys = set(values[0])
    for value in values:
        if set(value) != keys:
            raise _fail(where, f"every entry must set the same keys ({', '.join(sorted(keys))}), got {value}")
        for key in value:
            _check_training_key(where, key)
            if key == "seed":
                raise _fail(where, "vary seeds with the top-level 'seeds' list")


def _flat(grid_point: Mapping[str, Any]) -> dict[str, Any]:
    """Linked entries ({d_model: 16, steps: 43302}) spread into their keys; plain values stay."""
    out: dict[str, Any] = {}
    for key, value in grid_point.items():
        out.update(value if isinstance(value, dict) else {key: value})
    return out


def parse_spec(data: Mapping[str, Any], source: str, default_name: str = "sweep") -> SweepSpec:
    """Check the spec's shape and keys; raises ConfigError naming the source and the key."""
    if "method" in data:
        data = from_wandb(data, source)
    unknown = [k for k in data if k not in TOP_KEYS]
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), TOP_KEYS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise _fail(source, f"unknown key {unknown[0]!r}{hint}; a sweep spec has {', '.join(TOP_KEYS)}")
    name = data.get("name", default_name)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise _fail(source, f"name must be letters, digits, '.', '_' or '-', got {name!r}")
    base = dict(_mapping(f"{source}: base", data.get("base")))
    for key in base:
        _check_training_key(f"{source}: base", key)
    if "steps" in data and "time_budget" in data:
        raise _fail(source, "give steps or time_budget per run, not both")
    for key in ("steps", "time_budget"):
        if key in data:
            base[key] = data[key]
    if "steps" in data:
        base["time_budget"] = None
    grid: dict[str, list[Any]] = {}
    for key, values in _mapping(f"{source}: grid", data.get("grid")).items():
        if isinstance(values, str) and "," in values:  # Hydra multirun's sweep syntax: lr: 0.001,0.003,0.01
            values = [yaml.safe_load(v.strip()) for v in values.split(",")]
        if isinstance(values, list) and values and all(isinstance(v, dict) for v in values):
            _check_group(f"{source}: grid.{key}", values)
        else:
            _check_training_key(f"{source}: grid", key)
        if key == "seed":
            raise _fail(f"{source}: grid", "vary seeds with the top-level 'seeds' list")
        if not isinstance(values, list):
            raise _fail(f"{source}: grid.{key}", f"expected a list of values, got {values!r}")
        if not values:
            raise _fail(f"{source}: grid.{key}", "empty list: a grid key needs at least one value")
        if len(set(map(repr, values))) != len(values):
            raise _fail(f"{source}: grid.{key}", f"repeated values in {values}")
        grid[key] = values
    grid_keys = [k for key, values in grid.items() for k in _flat({key: values[0]})]
    twice = sorted({k for k in grid_keys if grid_keys.count(k) > 1})
    if twice:
        raise _fail(f"{source}: grid", f"{twice[0]!r} is set by two grid keys")
    random = _mapping(f"{source}: random", data.get("random"))
    bad = [k for k in random if k not in RANDOM_KEYS]
    if bad:
        raise _fail(f"{source}: random", f"unknown key {bad[0]!r}; expected {', '.join(RANDOM_KEYS)}")
    params: dict[str, dict[str, Any]] = {}
    for key, dist in _mapping(f"{source}: random.parameters", random.get("parameters")).items():
        _check_training_key(f"{source}: random.parameters", key)
        if key in grid_keys or key == "seed":
            raise _fail(f"{source}: random.parameters.{key}", "already varied by the grid or seeds")
        params[key] = _parse_distribution(f"{source}: random.parameters.{key}", dist)
    count, rseed = random.get("count", 1 if params else 0), random.get("seed", 0)
    if random and not params:
        raise _fail(f"{source}: random", "no parameters to draw")
    for key, value in (("count", count), ("seed", rseed)):
        if not isinstance(value, int) or isinstance(value, bool) or value < (1 if key == "count" and params else 0):
            raise _fail(f"{source}: random.{key}", f"must be a {'positive' if key == 'count' else 'non-negative'} "
                        f"integer, got {value!r}")
    seeds = data.get("seeds")
    if seeds is not None:
        if "seed" in base:
            raise _fail(source, "give seed in base or a seeds list, not both")
        if not isinstance(seeds, list) or not seeds:
            raise _fail(f"{source}: seeds", f"expected a non-empty list of integers, got {seeds!r}")
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds) or len(set(seeds)) < len(
            seeds
        ):
            raise _fail(f"{source}: seeds", f"expected distinct integers >= 0, got {seeds}")
    if not grid and not params and seeds is None:
        raise _fail(source, "nothing varies: give a grid, random parameters or seeds")
    spec = SweepSpec(name, source, base, grid, count, rseed, params, seeds)
    check_run_count(spec)
    return spec


def run_count(spec: SweepSpec) -> int:
    """How many runs the spec expands to, from the list lengths alone (nothing is built)."""
    draws = spec.random_count if spec.random_params else 1
    return math.prod(len(values) for values in spec.grid.values()) * draws * len(spec.seeds or [None])


def check_run_count(spec: SweepSpec) -> None:
    n = run_count(spec)
    if n > MAX_RUNS:
        sizes = [f"{key} {len(values)}" for key, values in spec.grid.items()]
        if spec.random_params:
            sizes.append(f"random.count {spec.random_count}")
        if spec.seeds is not None:
            sizes.append(f"seeds {len(spec.seeds)}")
        raise _fail(spec.source, f"the spec expands to {n:,} runs ({' x '.join(sizes)}); a sweep may have at most "
                    f"{MAX_RUNS:,}: split it or vary fewer values")


def load_spec(path: str | Path) -> SweepSpec:
    """The spec in a file, or the shipped spec of that name (time_to_2)."""
    path = find(path, "sweep", "sweep spec")
    return parse_spec(read_yaml(path, "sweep spec"), str(path), default_name=path.stem)


def _round(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def draw_random(spec: SweepSpec) -> list[dict[str, Any]]:
    """spec.random_count draws of the random parameters; the same seed gives the same draws."""
    rng = np.random.default_rng(spec.random_seed)
    draws = []
    for _ in range(spec.random_count):
        draw: dict[str, Any] = {}
        for key, dist in spec.random_params.items():
            if "values" in dist:
                draw[key] = dist["values"][int(rng.integers(len(dist["values"])))]
            elif dist["distribution"] == "log_uniform":
                draw[key] = _round(math.exp(rng.uniform(math.log(dist["min"]), math.log(dist["max"]))))
            else:
                draw[key] = _round(rng.uniform(dist["min"], dist["max"]))
        draws.append(draw)
    return draws or [{}]


def _fmt(value: Any) -> str:
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return re.sub(r"[^A-Za-z0-9.+-]", "_", text)


def _finite_number(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def run_id(varied: Mapping[str, Any]) -> str:
    """A readable, filesystem-safe name from the varied values, e.g. d_model=16,lr=0.01,seed=1."""
    return ",".join(f"{key}={_fmt(value)}" for key, value in varied.items()) or "base"


def expand(spec: SweepSpec) -> list[Run]:
    """Every run of the sweep, each config checked with the trainer's rules (a bad one fails up front)."""
    check_run_count(spec)
    keys = list(spec.grid)
    combos = list(itertools.product(*spec.grid.values()))
    seeds: list[int | None] = list(spec.seeds) if spec.seeds is not None else [None]
    runs: list[Run] = []
    seen: set[str] = set()
    for combo in combos:
        for draw in draw_random(spec):
            for seed in seeds:
                varied = _flat(dict(zip(keys, combo, strict=True))) | draw
                if seed is not None:
                    varied["seed"] = seed
                rid = run_id(varied)
                if rid in seen:
                    raise _fail(spec.source, f"two runs would share the name {rid!r} (repeated random draws?)")
                seen.add(rid)
                layers = [(f"{spec.source}: base", spec.base), (f"{spec.source}: run {rid}", varied)]
                try:
                    cfg = build_config(layers)
                except ConfigError as e:  # a default clashing with a varied value: still name the run
                    raise e if str(e).startswith(spec.source) else _fail(f"{spec.source}: run {rid}", str(e)) from None
                runs.append(Run(rid, varied, cfg))
    return runs
