"""train(), load() and the Run they return: the CLI's behaviour as functions."""

from __future__ import annotations

import dataclasses
import tempfile
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..backends.backend import TrainState
from ..backends.registry import load_registry
from ..base.atomic import atomic_write_text
from ..base.errors import ConfigError, DataError, OutOfMemoryError
from ..base.paths import user_path
from ..data.names import clean_prefix
from ..model.choice import Choice
from ..model.sampling import TEXT_TEMPERATURE, default_prompt, forward_logits, sample_names, text_continuations
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
from .sample_output import DEFAULT_NEW_TOKENS
from .train_keys import TrainKeys

if TYPE_CHECKING:  # typing.Unpack is 3.11+; only type checkers read the annotation
    from typing_extensions import Unpack

ITEMS_FILE = "data.txt"  # train(data=[...]): the items, kept in the run directory

API_KEYS = "train() keys"  # how errors name the keyword arguments (the CLI says "command line")
OUT_KEY = "out"  # how errors name the out= keyword (the CLI says "--out")


@dataclass(repr=False)
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

    def __repr__(self) -> str:
        # The dataclass repr would print every parameter; this says what the run is in one line.
        val = f", val loss {self.val_loss:.4f}" if isinstance(self.val_loss, float) else ""
        where = f", {str(self.run_dir)!r}" if self.run_dir is not None else ""
        return f"Run({self.shape.describe()}, step {self.step:,}/{self.total_steps:,}{val}{where})"

    @property
    def train_loss(self) -> float | None:
        return self.metrics[-1].get("train_loss") if self.metrics else None

    @property
    def val_loss(self) -> float | None:
        return self.metrics[-1].get("val_loss") if self.metrics else None

    def sample(self, n: int = 20, temperature: float = 0.5, seed: int | None = None, *, prefix: str = "",
               max_len: int | None = None, unique: bool = False, top_k: int | None = None,
               top_p: float | None = None) -> list[str]:
        """n names (temperature 0: greedy; seed None: fresh names each call, a seed >= 0 reproduces them); drawn
        in batches of bounded memory, n up to MAX_SAMPLES; see eemicrogpt_core.model.sampling.sample_names."""
        names = sample_names(self.params, self.shape, self.vocab, n, Choice(temperature, top_k, top_p), seed,
                             prefix=clean_prefix(prefix, self.config.lowercase), max_len=max_len, unique=unique)
        return list(names)

    def generate(self, prompt: str | None = None, max_new_tokens: int = DEFAULT_NEW_TOKENS,
                 temperature: float = TEXT_TEMPERATURE, top_k: int | None = None, top_p: float | None = None,
                 seed: int | None = None, slide: int | None = None) -> str:
        """A text model's continuation of prompt (default: a newline if the text has one, else its first
        character): max_new_tokens characters, the prompt not included. Past the context a full window drops
        `slide` characters at a time (default: a quarter of the context; a character then sees between 3/4 of
        the context and all of it); slide=1 crops to the last `context` characters before each new one, as
        nanoGPT does (every character then runs the whole window: several times slower)."""
        text = default_prompt(self.vocab) if prompt is None else unicodedata.normalize("NFC", prompt)
        (chars,) = text_continuations(self.params, self.shape, self.vocab, text, max_new_tokens, 1,
                                      Choice(temperature, top_k, top_p), seed, slide)
        return "".join(chars)

    def logits(self, text: str) -> np.ndarray:
        """Logits [positions, vocab] (float64): for a list's model after the boundary and each character of text
        (len(text) + 1 rows, at most the context), for a text's after each character (1..context rows)."""
        bad = self.vocab.unknown(text)
        if bad is not None:
            raise ConfigError(f"character {bad!r} is not in the model's vocabulary")
        start = [self.vocab.boundary] if self.vocab.with_boundary else []
        tokens = [*start, *self.vocab.encode(text)]
        if not 1 <= len(tokens) <= self.shape.context:
            least, most = 1 - len(start), self.shape.context - len(start)
            raise ConfigError(f"the text has {len(text)} characters; the model reads {least}..{most} at once "
                              f"(its context is {self.shape.context})")
        return forward_logits(self.params, self.shape, np.array([tokens], dtype=np.int64))[0]

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


def _items_text(items: Sequence[str]) -> str:
    """The lines of a data file holding these items, which must be non-empty strings without line breaks."""
    if not items:
        raise DataError("data: the list of items is empty")
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise DataError(f"data: item {i} is {type(item).__name__} {item!r}, not a string")
        if not item.strip() or any(ch in item for ch in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"):
            raise DataError(f"data: item {i} ({item!r}) is blank or holds a line break; an item is one line")
    return "".join(f"{item}\n" for item in items)


def train(config: str | Path | None = None, *, data: str | Path | Sequence[str] | None = None,
          backend: str | None = None, progress: bool = True, **keys: Unpack[TrainKeys]) -> Run:
    """Train as `eemicrogpt train` does and return the Run.

    keys are the config keys (d_model=16, steps=300, lr=..., out=..., n_layers=..., context=...), with the
    CLI's precedence: keys > the YAML `config` file > the size's preset > built-in defaults; data: this
    argument > $EEMICROGPT_DATA > the config's data > the cached makemore names; backend: this argument >
    $EEMICROGPT_BACKEND > config > auto. A run directory is written (`out`, default runs/<time>-d<size>).
    progress: a progress bar and log lines (in a terminal or a notebook), or nothing.
    data may also be a list of items (names, words): they are written, one a line, to data.txt in the run
    directory, which the run then reads like any data file (so `--resume` finds it there).
    """
    cfg = load_config(config, dict(keys), what="config", overrides_source=API_KEYS)
    registry = load_registry()
    if isinstance(data, (list, tuple)):
        text = _items_text(data)
        with tempfile.TemporaryDirectory() as scratch:  # checked and prepared before the run directory exists
            staged = Path(scratch) / ITEMS_FILE
            staged.write_text(text, encoding="utf-8")
            plan = runs.plan_fresh(registry, cfg, backend=backend, data=str(staged), out_option=OUT_KEY)
        kept = plan.run_dir.path / ITEMS_FILE
        atomic_write_text(kept, text)  # the same bytes, so the checkpoint's data fingerprint holds
        plan.cfg = dataclasses.replace(plan.cfg, data=str(kept))
    else:
        plan = runs.plan_fresh(registry, cfg, backend=backend, data=str(data) if data is not None else None,
                               out_option=OUT_KEY)
    cfg = plan.cfg
    result = runs.execute(plan, registry, RichReporter() if progress else NullReporter())
    return Run(result.state.params, result.shape, result.vocab, cfg, result.run_dir, int(result.state.step),
               result.total_steps, list(result.records), result.losses, result.backend, result.target)


def load(run_dir: str | Path, best: bool = False) -> Run:
    """The run in a directory `eemicrogpt train` (or train() above) wrote: its last checkpoint and metrics, or
    with best=True its best.npz (the lowest validation loss of a run trained with keep_best)."""
    run = RunDir.existing(run_dir)
    try:
        return _load(run, best)
    except MemoryError:
        raise OutOfMemoryError(f"{run.path}: out of memory while loading the run; free memory or load it on a "
                               "larger machine") from None


def _load(run: RunDir, best: bool) -> Run:
    ckpt = load_checkpoint(run.model_file(best))
    target = TargetOutcome.of_run(ckpt.config, ckpt.target_reached)
    return Run(ckpt.state.params, ckpt.shape, ckpt.vocab, ckpt.config, run.path, int(ckpt.state.step),
               ckpt.total_steps, run.read_metrics(), None, ckpt.backend, target)
