"""`log_to`: TensorBoard event files read back with TensorBoard's own reader, and a W&B offline run read from
its run directory's .wandb file; metrics.jsonl stays the record they repeat."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from extras import import_extra

from eemicrogpt_core.backends.registry import BackendRegistry
from eemicrogpt_core.base.errors import ConfigError
from eemicrogpt_core.training import runs
from eemicrogpt_core.training.config import TrainConfig, build_config

SAMPLES = 10


@pytest.fixture(scope="module")
def cfg(names_file: Path) -> TrainConfig:
    return TrainConfig(d_model=16, steps=200, lr=0.01, backend="numpy_ref", data=str(names_file), log_every=100,
                       eval_batches=4)


def train_logged(registry: BackendRegistry, cfg: TrainConfig, out: Path, log_to: str) -> list[dict[str, Any]]:
    plan = runs.plan_fresh(registry, dataclasses.replace(cfg, out=str(out), log_to=log_to))
    runs.execute(plan, registry)
    return plan.run_dir.read_metrics()


def test_tensorboard_event_files_hold_the_metrics(registry: BackendRegistry, cfg: TrainConfig,
                                                  tmp_path: Path) -> None:
    import_extra("tensorboard", "pip install 'eemicrogpt[tensorboard]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    records = train_logged(registry, cfg, tmp_path / "run", "tensorboard")
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    for key, tag in (("train_loss", "loss/train"), ("val_loss", "loss/val"), ("lr", "lr"),
                     ("us_per_step", "us_per_step")):
        events = acc.Scalars(tag)
        assert [e.step for e in events] == [r["step"] for r in records] == [100, 200]
        # TensorBoard stores scalars as float32: each equals the record's value rounded to float32.
        assert [e.value for e in events] == [float(np.float32(r[key])) for r in records], tag
    (samples,) = acc.Tensors("samples")
    assert samples.step == 200
    assert len(samples.tensor_proto.string_val[0].decode().split(", ")) == SAMPLES


def wandb_records(path: Path) -> list[Any]:
    """The records of a W&B .wandb file: a 7-byte header, then LevelDB-log blocks of 32 KiB whose chunks (a
    7-byte header: crc32, length, type full/first/middle/last) carry serialized Record protos."""
    from wandb.proto import wandb_internal_pb2

    raw, block, pos = path.read_bytes(), 32768, 7
    assert raw[:4] == b":W&B"
    payloads, pending = [], b""
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # too little room left in the block for a chunk header: padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        data, pos = raw[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 2):
            pending = data
        elif kind in (3, 4):
            pending += data
        if kind in (1, 4):
            payloads.append(pending)
    out = []
    for payload in payloads:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        out.append(record)
    return out


def test_wandb_offline_run_holds_the_metrics(registry: BackendRegistry, cfg: TrainConfig, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import_extra("wandb", "pip install 'eemicrogpt[wandb]'")
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline is the default
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    records = train_logged(registry, cfg, tmp_path / "run", "wandb")
    (run_file,) = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    kept = wandb_records(run_file)
    kinds = [r.WhichOneof("record_type") for r in kept]
    assert kinds.count("run") == 1, (kinds, run_file.stat().st_size)
    (run,) = [r.run for r in kept if r.WhichOneof("record_type") == "run"]
    assert run.display_name == "run" and run.project == "eemicrogpt"
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["d_model"] == 16 and config["log_to"] == "wandb"
    history = [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
               for r in kept if r.WhichOneof("record_type") == "history"]
    assert [h["_step"] for h in history] == [100, 200]
    for row, record in zip(history, records, strict=True):
        assert row["loss/train"] == record["train_loss"] and row["loss/val"] == record["val_loss"]
        assert row["lr"] == record["lr"] and row["us_per_step"] == record["us_per_step"]
    samples = [json.loads(u.value_json) for r in kept if r.WhichOneof("record_type") == "summary"
               for u in r.summary.update if u.key == "samples"]
    assert len(samples) == 1 and len(samples[0].split(", ")) == SAMPLES


def test_a_missing_extra_is_one_line_before_anything_is_written(registry: BackendRegistry, cfg: TrainConfig,
                                                                tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError) as e:
        runs.plan_fresh(registry, dataclasses.replace(cfg, out=str(tmp_path / "run"), log_to="tensorboard,wandb"))
    assert str(e.value) == "--log-to wandb needs the wandb package: pip install 'eemicrogpt[wandb]'"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", ["tensorbored", "", "wandb,csv"])
def test_unknown_sinks_are_refused(value: str) -> None:
    with pytest.raises(ConfigError, match=r"t\.yaml: log_to must name tensorboard and/or wandb"):
        build_config([("t.yaml", {"log_to": value})])


def test_resume_may_start_logging(registry: BackendRegistry, cfg: TrainConfig, tmp_path: Path) -> None:
    import_extra("tensorboard", "pip install 'eemicrogpt[tensorboard]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    plan = runs.plan_fresh(registry, dataclasses.replace(cfg, steps=100, out=str(tmp_path / "run")))
    runs.execute(plan, registry)
    assert not (tmp_path / "run" / "tensorboard").exists()
    more = runs.plan_resume(registry, tmp_path / "run", extend_to=200, changes={"log_to": "tensorboard"})
    assert isinstance(more, runs.RunPlan) and more.cfg.log_to == "tensorboard"
    runs.execute(more, registry)
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss/val")] == [200]
