"""One sweep run in an ordinary run directory: fresh, resumed from its checkpoint, or already finished.

The same trainer and run-directory code as `eemicrogpt train`; this module only decides which of the three
cases applies and turns the outcome into one results record. Errors become a failed record with a one-line
message, so one bad run never stops the others.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
import traceback
from pathlib import Path
from typing import Any

from ..backends.registry import BackendRegistry
from ..base.errors import BackendSelectionError, EemicrogptError
from ..data.names import Dataset, encode, read_names, split
from ..model.shape import NAMES_VOCAB
from ..model.vocab import Vocabulary
from ..training import runs
from ..training.checkpoint import load_checkpoint
from ..training.config import TrainConfig, build_config
from ..training.rundir import RunDir
from ..training.target import TargetOutcome
from ..training.trainer import PreparedData, prepare_data

DONE, FAILED, INTERRUPTED = "done", "failed", "interrupted"
UNAVAILABLE = "unavailable"  # no backend here runs the run's precision or shape: skipped, not failed
# Copied from each run's config into its record whether varied or not: the plots group and place runs by them.
SUMMARY_KEYS = ("d_model", "n_heads", "batch", "lr", "seed", "time_budget", "threads", "precision", "target_loss")


def one_line(error: BaseException) -> str:
    text = str(error) if isinstance(error, EemicrogptError) else f"{type(error).__name__}: {error}"
    return " ".join(text.split())


def base_record(run_id: str, config: dict[str, Any], varied: dict[str, Any]) -> dict[str, Any]:
    """What every record of a run starts with: its id, the summary keys of its config and its varied values,
    also kept apart under "varied" (a varied key such as steps or backend shares its name with an outcome,
    which replaces it at the top level)."""
    return {"run_id": run_id, **{key: config.get(key) for key in SUMMARY_KEYS}, **varied, "varied": dict(varied)}


def unavailable_reason(cfg: TrainConfig, registry: BackendRegistry) -> str | None:
    """Why `auto` finds no backend here for this run (a precision no installed backend computes in, such as
    bf16 on a CPU without bf16 kernels, or a shape none runs); None when it finds one, or when the run names
    its backend (whether that one runs is for registry.select to say, as `train` does)."""
    if cfg.backend not in ("", "auto"):
        return None
    try:  # the names vocabulary stands in until the data is read, as for `train`
        registry.select(cfg.backend, cfg.model_shape(NAMES_VOCAB), cfg.batch, cfg.dtype, cfg.precision)
    except BackendSelectionError as e:
        return one_line(e)
    return None


@functools.lru_cache(maxsize=4)
def _encoded(path: str, mtime_ns: int, drop_invalid: bool, lowercase: bool,
             context: int) -> tuple[Dataset, int, int, Vocabulary, str]:
    """The names file read and encoded once per worker (the largest part of a short run's overhead)."""
    names = read_names(path, drop_invalid=drop_invalid, lowercase=lowercase)
    vocab = Vocabulary.from_names(names.names)
    data, n_truncated = encode(names.names, vocab, context)
    return data, n_truncated, names.n_dropped, vocab, names.sha256


def prepared_data(cfg: TrainConfig, vocab: Vocabulary | None = None) -> PreparedData:
    """What trainer.prepare_data returns, with the file's parsing cached across a worker's fresh runs (a
    resumed run checks the file against its checkpoint's vocabulary instead; a text is read each time)."""
    if vocab is not None or cfg.data_format == "text":
        return prepare_data(cfg, vocab)
    try:
        mtime = os.stat(str(cfg.data)).st_mtime_ns
    except OSError:
        mtime = -1  # read_names reports the missing or unreadable file
    data, n_truncated, n_dropped, vocab, sha = _encoded(str(cfg.data), mtime, cfg.drop_invalid, cfg.lowercase,
                                                        cfg.context)
    parts = split(data, cfg.val_fraction, cfg.seed)
    return PreparedData(parts.train, parts.validation, n_truncated, n_dropped, vocab, sha, parts.note)


def _finished_record(run: RunDir) -> dict[str, Any]:
    """The record of a run that a previous invocation finished (results.jsonl may have missed it)."""
    ckpt = load_checkpoint(run.checkpoint_path)
    last = run.read_metrics()[-1] if run.read_metrics() else {}
    outcome = TargetOutcome.of_run(ckpt.config, ckpt.target_reached)
    return {
        **(outcome.as_record() if outcome is not None else {}),
        "status": DONE if ckpt.finished else INTERRUPTED,
        "steps": int(ckpt.state.step),
        "total_steps": int(ckpt.total_steps),
        "train_loss": last.get("train_loss"),
        "val_loss": last.get("val_loss"),
        "us_per_step": last.get("us_per_step"),
        "backend": ckpt.backend,
    }


def run_one(task: dict[str, Any], registry: BackendRegistry) -> dict[str, Any]:
    """Train task['config'] (a config dict) in task['run_dir']; returns the results record (never raises
    except KeyboardInterrupt from outside the trainer's own Ctrl-C handling)."""
    started = time.perf_counter()
    record = base_record(task["run_id"], task["config"], task["varied"])
    try:
        cfg: TrainConfig = build_config([(f"run {task['run_id']}", task["config"])])
        reason = unavailable_reason(cfg, registry)  # the local driver skips these; a Ray node may lack one too
        if reason is not None:
            record.update(status=UNAVAILABLE, error=reason)
            return _finish(record, started)
        run = RunDir(Path(task["run_dir"]))
        resume = None
        if run.checkpoint_path.is_file():
            planned = runs.plan_resume(registry, run.path, backend=cfg.backend, data=cfg.data,
                                       prepare=prepared_data)
            if isinstance(planned, runs.AlreadyFinished):
                record.update(_finished_record(run), resumed_from=int(planned.checkpoint.state.step))
                return _finish(record, started)
            plan, resume = planned, planned.resume
        else:
            plan = runs.plan_fresh(registry, dataclasses.replace(cfg, out=str(run.path)), backend=cfg.backend,
                                   data=cfg.data, prepare=prepared_data)
        result = runs.execute(plan, registry)
        steps = int(result.state.step)
        if result.interrupted:  # what a resume continues from (a stop inside a backend call keeps an older one)
            steps = int(load_checkpoint(run.checkpoint_path).state.step) if run.checkpoint_path.is_file() else 0
        record.update(
            status=INTERRUPTED if result.interrupted else DONE,
            steps=steps,
            total_steps=int(result.total_steps),
            train_loss=result.train_loss,
            val_loss=result.val_loss,
            us_per_step=round(result.us_per_step, 3),
            backend=result.backend,
            resumed_from=int(resume.state.step) if resume else 0,
        )
        if result.contention is not None:
            record.update(result.contention.as_record())
        if result.target is not None:
            record.update(result.target.as_record())
    except EemicrogptError as e:
        record.update(status=FAILED, error=one_line(e))
    except Exception as e:  # a bug or a backend fault in one run must not take the sweep down
        where = traceback.extract_tb(e.__traceback__)[-1]
        record.update(status=FAILED, error=f"{one_line(e)} (at {Path(where.filename).name}:{where.lineno})")
    return _finish(record, started)


def _finish(record: dict[str, Any], started: float) -> dict[str, Any]:
    """Wall time of this invocation, and training time: all steps at this invocation's speed (a resumed run's
    earlier part ran at about the same speed; the Pareto chart plots this)."""
    record["wall_s"] = round(time.perf_counter() - started, 3)
    if record.get("steps") and record.get("us_per_step"):
        record["train_s"] = round(record["steps"] * record["us_per_step"] / 1e6, 4)
    return record
