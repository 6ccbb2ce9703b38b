"""train(), load() and the Run they return: the CLI's behaviour as functions."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..backends.backend import TrainState
from ..backends.registry import load_registry
from ..base.errors import ConfigError, OutOfMemoryError
from ..base.paths import user_path
from ..data.names import clean_prefix
from ..model.sampling import generate
from ..model.shape import ModelShape
from ..model.vocab import Vocabulary
from ..training import runs
from ..training.checkpoint import Checkpoint, load_checkpoint
from ..training.config import TrainConfig, load_config
from ..training.evaluation import FileLoss
from ..training.progress import RichReporter
from ..training.rundir import RunDir
from ..training.target import TargetOutcome
from ..training.trainer import NullReporter

API_KEYS = "train() keys"  # how errors name the keyword arguments (the CLI says "command line")


@dataclass
class Run:
    """A trained model: its parameters, shape and vocabulary, and what training recorded."""

    params: np.ndarray  # flat, in the ABI's layout (eemicrogpt_core.model.shape.views names the tensors)
    shape: ModelShape
    vocab: Vocabulary
    config: TrainConfig
    run_dir: Path | None
    step: int
    total_steps: int
    metrics: list[dict[str, Any]] = field(default_factory=list)  # one record per log step
    losses: np.ndarray | None = None  # per-step train losses of the training call (None for a loaded run)
    backend: str = ""
    target: TargetOutcome | None = None  # with a target_loss: reached, steps_to_target, seconds_to_target

    @property
    def train_loss(self) -> float | None:
        return self.metrics[-1].get("train_loss") if self.metrics else None

    @property
    def val_loss(self) -> float | None:
        return self.metrics[-1].get("val_loss") if self.metrics else None

    def sample(self, n: int = 10, temperature: float = 0.5, seed: int = 0, *, prefix: str = "",
               max_len: int | None = None, unique: bool = False) -> list[str]:
        """n names (temperature 0: greedy); see eemicrogpt_core.model.sampling.generate."""
        return generate(self.params, self.shape, self.vocab, n, temperature, seed,
                        prefix=clean_prefix(prefix, self.config.lowercase), max_len=max_len, unique=unique)

    def logits(self, text: str) -> np.ndarray:
        """Logits [len(text) + 1, vocab] after the boundary and each character of text (float64)."""
        from ..model.sampling import forward_logits

        bad = self.vocab.unknown(text)
        if bad is not None:
            raise ConfigError(f"character {bad!r} is not in the model's vocabulary")
        tokens = np.array([[self.vocab.boundary, *self.vocab.encode(text)]], dtype=np.int64)
        return forward_logits(self.params, self.shape, tokens)[0]

    def eval(self, data: str | Path, backend: str | None = None) -> FileLoss:
        """Mean loss over a whole file in the run's format (every name of a list, every character of a text):
        `.loss` in nats, `.bits` per character (per token for lists), as `eemicrogpt eval` prints; the figure
        the validation line prints when the file is the run's held-out part and it fits in eval_batches."""
        from ..training.evaluation import evaluate_file

        state = TrainState(self.params, np.zeros_like(self.params), np.zeros_like(self.params), self.step)
        ckpt = Checkpoint(state, self.total_steps, {}, self.config, self.vocab)
        return evaluate_file(load_registry(), ckpt, user_path(data, "data"), backend)

    def export(self, path: str | Path, format: str = "safetensors") -> Path:
        """Write the weights to a new file (safetensors: tensors by name, shape, config and vocabulary in the
        metadata); see eemicrogpt_core.tools.export."""
        from ..tools.export import export_run

        return export_run(self, user_path(path, "export path"), format)

    def to_torch(self) -> Any:
        """A torch.nn.Module with these weights whose logits match ours (needs PyTorch)."""
        from ..tools.torch_model import to_torch

        return to_torch(self.params, self.shape)


def train(config: str | Path | None = None, *, data: str | Path | None = None, backend: str | None = None,
          progress: bool = True, **keys: Any) -> Run:
    """Train as `eemicrogpt train` does and return the Run.

    keys are the config keys (d_model=16, steps=300, lr=..., out=..., n_layers=..., context=...), with the
    CLI's precedence: keys > the YAML `config` file > the size's preset > built-in defaults; data: this
    argument > $EEMICROGPT_DATA > the config's data > the cached makemore names; backend: this argument >
    $EEMICROGPT_BACKEND > config > auto. A run directory is written (`out`, default runs/<time>-d<size>).
    progress: a progress bar and log lines (in a terminal or a notebook), or nothing.
    """
    cfg = load_config(user_path(config, "config") if config is not None else None, keys, API_KEYS)
    registry = load_registry()
    plan = runs.plan_fresh(registry, cfg, backend=backend, data=str(data) if data is not None else None)
    cfg = plan.cfg
    result = runs.execute(plan, registry, RichReporter() if progress else NullReporter())
    return Run(result.state.params, result.shape, result.vocab, cfg, result.run_dir, int(result.state.step),
               result.total_steps, list(result.records), result.losses, result.backend, result.target)


def load(run_dir: str | Path) -> Run:
    """The run in a directory `eemicrogpt train` (or train() above) wrote: its last checkpoint and metrics."""
    run = RunDir.existing(run_dir)
    try:
        return _load(run)
    except MemoryError:
        raise OutOfMemoryError(f"{run.path}: out of memory while loading the run; free memory or load it on a "
                               "larger machine") from None


def _load(run: RunDir) -> Run:
    ckpt = load_checkpoint(run.checkpoint_path)
    target_loss = ckpt.config.target_loss
    target = TargetOutcome.of(target_loss, ckpt.target_reached) if target_loss is not None else None
    return Run(ckpt.state.params, ckpt.shape, ckpt.vocab, ckpt.config, run.path, int(ckpt.state.step),
               ckpt.total_steps, run.read_metrics(), None, ckpt.backend, target)
