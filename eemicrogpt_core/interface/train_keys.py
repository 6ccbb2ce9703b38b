"""TrainKeys: the config keys as keyword arguments of eemicrogpt.train(), typed, so that an editor completes
and a type checker checks them. It mirrors training.config.TrainConfig (less `data` and `backend`, which
train() takes as arguments of their own); tests/test_python_api.py holds the two equal."""

from __future__ import annotations

from typing import Literal, TypedDict


class TrainKeys(TypedDict, total=False):
    d_model: int
    n_heads: int
    n_layers: int
    context: int
    batch: int
    steps: int
    time_budget: float | None
    target_loss: float | None
    target_metric: Literal["train", "val"]
    lr: float
    lr_schedule: Literal["linear", "cosine"]
    warmup_steps: int
    min_lr: float
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    grad_clip: float
    seed: int
    data_format: Literal["lines", "text"]
    drop_invalid: bool
    lowercase: bool
    val_fraction: float
    keep_best: bool
    patience: int | None
    log_to: str | None
    log_every: int
    sample_every: int | None
    eval_batches: int
    chunk_steps: int
    out: str | None
    dtype: Literal["float32", "float64", "float16"]
    threads: int | Literal["auto"] | None
    precision: Literal["fp32", "bf16", "fp16"] | None
