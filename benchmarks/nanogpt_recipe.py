"""nanoGPT's CPU recipe for tiny Shakespeare against eemicrogpt, on the same file, split and machine.

The PyTorch side is an idiomatic implementation of nanoGPT's model and training loop, written here from its
description: learned token and position embeddings, pre-LayerNorm blocks (causal self-attention through
F.scaled_dot_product_attention, a 4x GELU MLP), a final LayerNorm, an LM head tied to the token embedding,
N(0, 0.02) initialisation (residual projections 0.02 / sqrt(2 n_layer)); AdamW with weight decay 0.1 on
tensors of two or more dimensions only, betas (0.9, 0.99); linear warm-up over 100 iterations, then cosine
decay to min_lr at lr_decay_iters; gradients clipped to norm 1.0; dropout 0. The CPU recipe from nanoGPT's
README: block_size 64, batch 12, 4 layers, 4 heads, n_embd 128, 2,000 iterations (lr_decay_iters 2,000),
lr 1e-3, min_lr 1e-4. Biases are off, as nanoGPT's train.py runs the recipe (`bias = False` there, not set
by config/train_shakespeare_char.py); --bias puts them in LayerNorms and Linears as GPTConfig's default does.

Data, as nanoGPT's data/shakespeare_char/prepare.py: the vocabulary is the file's sorted distinct characters,
the first 90% of the characters train and the last 10% validate; a batch is `batch` windows of block_size + 1
characters at random offsets of the training part.

Validation, the same for both sides: the mean cross-entropy (nats) over the FULL held-out part, every
position of consecutive non-overlapping windows (window k predicts characters k*T+1 .. k*T+T from characters
k*T .. k*T+T-1, T = the model's context; the last window is shorter), so every held-out character but the
first is predicted once. Both sides are evaluated in PyTorch float32 (eemicrogpt's parameters through
eemicrogpt_core.tools.torch_model), so the number is computed by one piece of code.

The clock is training time only. PyTorch: wall seconds of the training iterations (batch drawing, forward,
backward, clipping, the AdamW step), paused while the held-out part is evaluated. eemicrogpt: its `eemicrogpt
train` command runs as a user would run it; its metrics.jsonl records hold the step and `us_per_step`, the
mean over the run so far of the seconds inside the backend's train_steps calls, so the training seconds at a
record are us_per_step x step (the records have no cumulative seconds field). That leaves out the trainer's
Python between chunks (batch drawing, the LR list), its own validation and its checkpoints.

When to evaluate is one schedule in training seconds for both sides (Schedule): --eval-seconds apart, or
--eval-spacing of the time so far when that is longer, and just before 60 s and 300 s. PyTorch evaluates
after the iteration at which one is due. eemicrogpt writes a checkpoint at every log step (--emg-log-every
steps); while it trains, each checkpoint at which an evaluation is due is kept by a hard link, and after the
run every kept one is evaluated.

Reported per side: the training seconds of the first evaluation at or below each validation loss (2.20, 2.00,
1.90, 1.88), an upper bound whose resolution is the interval between evaluations; and the best validation
loss of the evaluations within 60 s and 300 s of training.

    python benchmarks/nanogpt_recipe.py                       # the whole comparison: a few minutes of training
    python benchmarks/nanogpt_recipe.py --json > nanogpt.json
    python benchmarks/nanogpt_recipe.py --smoke --data names.txt --emg-config configs/d16.yaml   # seconds
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"
DEFAULT_EMG_CONFIG = REPO / "configs" / "shakespeare_char_cpu.yaml"
THRESHOLDS = (2.2, 2.0, 1.9, 1.88)
BUDGETS = (60.0, 300.0)
VAL_FRACTION = 0.1
EVAL_WINDOWS = 256  # windows per forward call when evaluating the held-out part
POLL_SECONDS = 0.02  # how often the eemicrogpt run directory is checked for a new checkpoint
# --smoke: a few iterations on a slice of the file; the numbers it prints measure nothing.
SMOKE_CHARS = 20_000
SMOKE_ITERS = 6
SMOKE_LOG_EVERY = 3


class BenchError(Exception):
    """A one-line reason the benchmark cannot run (exit status 2)."""


@dataclass(frozen=True)
class Recipe:
    """nanoGPT's CPU recipe for shakespeare_char (README's command line over config/train_shakespeare_char.py)."""

    block_size: int = 64
    batch_size: int = 12
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = False
    max_iters: int = 2000
    lr_decay_iters: int = 2000
    warmup_iters: int = 100
    learning_rate: float = 1e-3
    min_lr: float = 1e-4
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0
    seed: int = 1337


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise BenchError("this benchmark needs PyTorch: pip install torch") from None
    return torch


# ---- data ----------------------------------------------------------------------------------------------------

def read_text(path: Path, limit: int | None = None) -> str:
    """The file as one string (UTF-8), its first `limit` characters when given."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BenchError(f"{path}: no such file (pass --data PATH)") from None
    except UnicodeDecodeError as e:
        raise BenchError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise BenchError(f"{path}: cannot read it ({e.strerror})") from None
    text = text[:limit] if limit is not None else text
    if len(text) < 2:
        raise BenchError(f"{path}: too short to split into a training and a held-out part")
    return text


def split_text(text: str, val_fraction: float = VAL_FRACTION) -> tuple[str, str]:
    """nanoGPT's split: the first int(n * (1 - val_fraction)) characters train, the rest validate."""
    cut = int(len(text) * (1 - val_fraction))
    return text[:cut], text[cut:]


def char_vocab(text: str) -> dict[str, int]:
    """The sorted distinct characters of the whole file, numbered."""
    return {ch: i for i, ch in enumerate(sorted(set(text)))}


def encode(text: str, vocab: dict[str, int]) -> Any:
    torch = _torch()
    return torch.tensor([vocab[ch] for ch in text], dtype=torch.long)


def held_out_loss(logits_of: Callable[[Any], Any], val: Any, block_size: int, windows: int = EVAL_WINDOWS) -> float:
    """Mean cross-entropy (nats) over every position of consecutive non-overlapping windows of the held-out
    tokens `val`: window k reads val[kT : kT + T] and predicts val[kT + 1 : kT + T + 1]; the last, shorter
    window covers what is left, so each token but the first is predicted exactly once."""
    torch = _torch()
    import torch.nn.functional as F

    n_targets = val.numel() - 1
    if n_targets < 1:
        raise BenchError("the held-out part is shorter than two characters")
    full = n_targets // block_size
    total = torch.zeros((), dtype=torch.float64)
    with torch.inference_mode():
        body = val[: full * block_size + 1]
        for first in range(0, full, windows):
            k = min(windows, full - first)
            start = first * block_size
            x = body[start:start + k * block_size].view(k, block_size)
            y = body[start + 1:start + 1 + k * block_size].view(k, block_size)
            logits = logits_of(x)
            total += F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum").double()
        rest = n_targets - full * block_size
        if rest:
            x = val[full * block_size:full * block_size + rest].view(1, rest)
            y = val[full * block_size + 1:].view(1, rest)
            logits = logits_of(x)
            total += F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum").double()
    return float(total) / n_targets


# ---- what a side reports -------------------------------------------------------------------------------------

@dataclass
class Evaluation:
    seconds: float  # training seconds so far
    step: int
    val_loss: float


@dataclass
class Side:
    name: str
    label: str  # what ran: the recipe, or the config and backend
    threads: str
    evaluations: list[Evaluation] = field(default_factory=list)
    steps: int = 0
    train_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def time_to(self, loss: float) -> float | None:
        """Training seconds of the first evaluation at or below `loss` (None: never reached)."""
        return next((e.seconds for e in self.evaluations if e.val_loss <= loss), None)

    def best_within(self, seconds: float) -> float | None:
        return min((e.val_loss for e in self.evaluations if e.seconds <= seconds), default=None)

    def summary(self) -> dict[str, Any]:
        gaps = [b.seconds - a.seconds for a, b in itertools.pairwise(self.evaluations)]
        return {
            **asdict(self),
            "time_to": {f"{t:.2f}": self.time_to(t) for t in THRESHOLDS},
            "best_within": {f"{b:g}": self.best_within(b) for b in BUDGETS},
            "final_val_loss": self.evaluations[-1].val_loss if self.evaluations else None,
            "median_eval_interval_s": sorted(gaps)[len(gaps) // 2] if gaps else None,
        }


@dataclass
class Schedule:
    """When to evaluate, in seconds of training, the same for both sides: `every` seconds apart, or `spacing`
    of the time so far when that is longer, so a time to a threshold is known to within max(every, spacing x
    itself) at a bounded number of evaluations (about 75 in 300 s at the defaults). An evaluation is also due
    just before a budget (60 s, 300 s) would be passed, so the best loss within it is measured near its end."""

    every: float = 1.0
    spacing: float = 0.05
    next_at: float = 0.0

    def due(self, seconds: float, step_seconds: float) -> bool:
        """Whether to evaluate now, `seconds` into training, the next step (or log interval) being expected to
        take `step_seconds`."""
        crosses = any(seconds < b <= seconds + step_seconds for b in BUDGETS)
        return seconds >= self.next_at or crosses

    def evaluated(self, seconds: float) -> None:
        self.next_at = max(seconds + self.every, seconds * (1 + self.spacing))


# ---- the PyTorch side: nanoGPT's model and loop --------------------------------------------------------------

def build_gpt(recipe: Recipe, vocab_size: int) -> Any:
    torch = _torch()
    import torch.nn.functional as F
    from torch import nn

    d, heads = recipe.n_embd, recipe.n_head
    if d % heads:
        raise BenchError(f"n_embd {d} is not a multiple of n_head {heads}")

    class SelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(d, 3 * d, bias=recipe.bias)
            self.proj = nn.Linear(d, d, bias=recipe.bias)

        def forward(self, x: Any) -> Any:
            b, t, _ = x.shape
            q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in self.qkv(x).split(d, dim=2))
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=recipe.dropout if self.training else 0.0,
                                               is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(b, t, d))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(d, bias=recipe.bias)
            self.attn = SelfAttention()
            self.ln2 = nn.LayerNorm(d, bias=recipe.bias)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d, bias=recipe.bias), nn.GELU(),
                                     nn.Linear(4 * d, d, bias=recipe.bias), nn.Dropout(recipe.dropout))
            self.attn_drop = nn.Dropout(recipe.dropout)

        def forward(self, x: Any) -> Any:
            x = x + self.attn_drop(self.attn(self.ln1(x)))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab_size, d)
            self.pos = nn.Embedding(recipe.block_size, d)
            self.drop = nn.Dropout(recipe.dropout)
            self.blocks = nn.ModuleList(Block() for _ in range(recipe.n_layer))
            self.ln_f = nn.LayerNorm(d, bias=recipe.bias)
            self.head = nn.Linear(d, vocab_size, bias=False)
            self.head.weight = self.tok.weight  # tied: one matrix embeds and un-embeds
            for module in self.modules():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(module.weight, 0.0, 0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
            for block in self.blocks:  # residual projections scaled down by depth
                for proj in (block.attn.proj, block.mlp[2]):
                    nn.init.normal_(proj.weight, 0.0, 0.02 / math.sqrt(2 * recipe.n_layer))

        def forward(self, idx: Any) -> Any:
            t = idx.size(1)
            x = self.drop(self.tok(idx) + self.pos(torch.arange(t, device=idx.device)))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln_f(x))

    return GPT()


def adamw(model: Any, recipe: Recipe) -> Any:
    """AdamW with weight decay on the matrices (Linear weights, embeddings) and none on biases and norms."""
    torch = _torch()
    params = [p for p in model.parameters() if p.requires_grad]  # a tied tensor is listed once
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": recipe.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=recipe.learning_rate, betas=(recipe.beta1, recipe.beta2))


def lr_at(it: int, recipe: Recipe) -> float:
    """Iteration it (0-based): linear warm-up to learning_rate over warmup_iters, cosine down to min_lr at
    lr_decay_iters, min_lr after."""
    if it < recipe.warmup_iters:
        return recipe.learning_rate * (it + 1) / (recipe.warmup_iters + 1)
    if it >= recipe.lr_decay_iters:
        return recipe.min_lr
    ratio = (it - recipe.warmup_iters) / (recipe.lr_decay_iters - recipe.warmup_iters)
    return recipe.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (recipe.learning_rate - recipe.min_lr)


def run_torch(text: str, recipe: Recipe, threads: int, schedule: Schedule, say: Callable[[str], None]) -> Side:
    torch = _torch()
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    torch.manual_seed(recipe.seed)
    vocab = char_vocab(text)
    train_text, val_text = split_text(text)
    train, val = encode(train_text, vocab), encode(val_text, vocab)
    if train.numel() < recipe.block_size + 1:
        raise BenchError(f"the training part ({train.numel()} characters) is shorter than one window "
                         f"({recipe.block_size + 1})")
    model = build_gpt(recipe, len(vocab))
    optimizer = adamw(model, recipe)
    offsets = torch.arange(recipe.block_size + 1)
    side = Side("nanoGPT recipe", f"PyTorch {torch.__version__}, {recipe.n_layer} layers, d{recipe.n_embd}, "
                f"block {recipe.block_size}, batch {recipe.batch_size}, {recipe.max_iters} iterations",
                str(torch.get_num_threads()))

    def evaluate(step: int) -> None:
        model.eval()
        side.evaluations.append(Evaluation(round(side.train_seconds, 4), step,
                                           held_out_loss(model, val, recipe.block_size)))
        model.train()
        say(f"  torch step {step}: val {side.evaluations[-1].val_loss:.4f} at {side.train_seconds:.1f} s")

    model.train()
    step_seconds = 0.0
    for it in range(recipe.max_iters):
        t0 = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(it, recipe)
        windows = train[torch.randint(train.numel() - recipe.block_size, (recipe.batch_size, 1)) + offsets]
        x, y = windows[:, :-1], windows[:, 1:]
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step_seconds = time.perf_counter() - t0
        side.train_seconds += step_seconds
        side.steps = it + 1
        if schedule.due(side.train_seconds, step_seconds) or side.steps == recipe.max_iters:
            evaluate(side.steps)  # outside the clock
            schedule.evaluated(side.train_seconds)
    side.train_seconds = round(side.train_seconds, 4)
    return side


# ---- the eemicrogpt side: its CLI, its metrics, its checkpoints ----------------------------------------------

def record_seconds(record: dict[str, Any]) -> float:
    """Training seconds at a metrics record of a fresh run: us_per_step is the mean over its steps so far."""
    return float(record["us_per_step"]) * int(record["step"]) / 1e6


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl, a line still being written left out."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


class CheckpointKeeper:
    """Keeps the checkpoints of a running `eemicrogpt train` that the schedule asks for.

    The trainer writes checkpoint.npz at each log step by renaming a new file over it, so a hard link keeps
    the old one whole (a file system without hard links gets a copy: an open file stays whole through a
    rename). When a new file appears, the newest metrics record says how far training has got; the file is
    kept when the schedule has an evaluation due by then. The last one is always kept."""

    def __init__(self, run_dir: Path, keep: Path, schedule: Schedule) -> None:
        self.path, self.metrics = run_dir / "checkpoint.npz", run_dir / "metrics.jsonl"
        self.keep, self.schedule = keep, schedule
        self.seen: tuple[int, int] | None = None  # (inode, mtime) of the last file looked at
        self.kept: tuple[int, int] | None = None  # and of the last one kept
        self.count = 0

    def poll(self, final: bool = False) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return
        ident = (st.st_ino, st.st_mtime_ns)
        if ident == self.kept or (ident == self.seen and not final):
            return
        self.seen = ident
        records = read_records(self.metrics)[-2:]
        seconds = [record_seconds(r) for r in records]
        if not final and (not seconds or not self.schedule.due(seconds[-1], seconds[-1] - seconds[0])):
            return
        self.count += 1
        target = self.keep / f"{self.count:06d}.npz"
        try:
            os.link(self.path, target)
        except OSError:
            shutil.copyfile(self.path, target)
        self.kept = ident
        if seconds:
            self.schedule.evaluated(seconds[-1])


def eemicrogpt_command() -> list[str]:
    """The `eemicrogpt` console script beside this Python, else the one on PATH."""
    beside = Path(sys.executable).parent / "eemicrogpt"
    found = str(beside) if beside.exists() else shutil.which("eemicrogpt")
    if found is None:
        raise BenchError("no `eemicrogpt` command beside this Python or on PATH: pip install . first")
    return [found]


def train_eemicrogpt(config: Path, data: Path, work: Path, extra_args: Sequence[str], schedule: Schedule,
                     say: Callable[[str], None]) -> tuple[Path, Path, list[dict[str, Any]]]:
    """Run `eemicrogpt train --config CONFIG --data DATA --out WORK/eemicrogpt-run EXTRA...`, keeping the
    checkpoints the schedule asks for; returns the run directory, the folder of kept checkpoints and the
    run's metrics records."""
    run_dir, keep = work / "eemicrogpt-run", work / "eemicrogpt-checkpoints"
    keep.mkdir()
    cmd = [*eemicrogpt_command(), "train", "--config", str(config), "--data", str(data), "--out", str(run_dir),
           *extra_args]
    say("  " + " ".join(cmd))
    keeper = CheckpointKeeper(run_dir, keep, schedule)
    with open(work / "eemicrogpt-train.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            while proc.poll() is None:
                keeper.poll()
                time.sleep(POLL_SECONDS)
        except BaseException:
            proc.terminate()  # Ctrl-C here: the run saves and stops at its next chunk
            proc.wait()
            raise
    keeper.poll(final=True)
    output = (work / "eemicrogpt-train.log").read_text(encoding="utf-8", errors="replace").strip().splitlines()
    if proc.returncode != 0:
        raise BenchError(f"eemicrogpt train exited with status {proc.returncode}: "
                         f"{output[-1] if output else 'no output'}")
    records = read_records(run_dir / "metrics.jsonl")
    if not records:
        raise BenchError(f"eemicrogpt train wrote no records in {run_dir / 'metrics.jsonl'}")
    return run_dir, keep, records


def run_tokens(vocab: Any, text: str) -> list[int]:
    """text in an eemicrogpt run's tokens (vocab: its Vocabulary); a list vocabulary reads a newline as the
    boundary between names."""
    lines = text.split("\n") if vocab.with_boundary else [text]
    bad = next((ch for ch in map(vocab.unknown, lines) if ch is not None), None)
    if bad is not None:
        raise BenchError(f"the held-out part has the character {bad!r}, outside the eemicrogpt run's vocabulary")
    tokens: list[int] = []
    for i, line in enumerate(lines):
        if i:
            tokens.append(vocab.boundary)
        tokens.extend(vocab.encode(line))
    return tokens


def run_eemicrogpt(config: Path, data: Path, text: str, work: Path, extra_args: Sequence[str], threads: int,
                   block_size: int, schedule: Schedule, say: Callable[[str], None]) -> Side:
    """Train with the CLI, then evaluate each kept checkpoint on the held-out part of `text` (the same split
    as the torch side's). A list model (lines format) reads the held-out text as names: a newline is its
    boundary token; that number exercises the harness and compares with nothing."""
    torch = _torch()
    from eemicrogpt_core.tools.torch_model import to_torch
    from eemicrogpt_core.training.checkpoint import load_checkpoint

    torch.set_num_threads(threads)  # for the evaluations, after the run
    run_dir, keep, records = train_eemicrogpt(config, data, work, extra_args, schedule, say)
    seconds = {int(r["step"]): record_seconds(r) for r in records}
    final = load_checkpoint(run_dir / "checkpoint.npz")
    cfg, vocab = final.config, final.vocab
    fmt = str(getattr(cfg, "data_format", "lines"))
    side = Side("eemicrogpt", f"{config.name}, backend {final.backend}, d{cfg.d_model}, {cfg.n_layers} layers, "
                f"context {cfg.context}, batch {cfg.batch}, {final.total_steps} steps, {fmt} format",
                "auto (its default)" if cfg.threads is None else str(cfg.threads))
    if vocab.with_boundary:
        side.notes.append("lines format: the held-out text read as names (a newline is the boundary token); "
                          "this number compares with nothing")
    val = torch.tensor(run_tokens(vocab, split_text(text)[1]), dtype=torch.long)
    if cfg.context != block_size:
        side.notes.append(f"context {cfg.context}, not {block_size}: its held-out windows are {cfg.context} long")
    for path in sorted(keep.glob("*.npz")):
        ckpt = load_checkpoint(path)
        step = int(ckpt.state.step)
        if step not in seconds or (side.evaluations and step <= side.evaluations[-1].step):
            continue  # not at a logged step, or seen already
        model = to_torch(ckpt.state.params, ckpt.shape).eval()
        side.evaluations.append(Evaluation(round(seconds[step], 4), step, held_out_loss(model, val, cfg.context)))
        say(f"  eemicrogpt step {step}: val {side.evaluations[-1].val_loss:.4f} at {seconds[step]:.1f} s")
    side.steps = int(final.state.step)
    side.train_seconds = round(seconds.get(side.steps, final.train_seconds), 4)
    side.notes.append(f"{len(side.evaluations)} of its {len(records)} logged checkpoints evaluated")
    return side


# ---- report --------------------------------------------------------------------------------------------------

def cpu_name() -> str:
    """/proc/cpuinfo's model name with its family and model numbers, and the logical CPUs this process has."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if not line.strip():
                    break  # the first processor's block is enough
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{name}, {cpus} logical CPUs"


def commit() -> str:
    """The checkout's commit, `+changes` when its tracked files differ from it."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def _cell(value: float | None, fmt: str, missing: str, unit: str = "") -> str:
    return missing if value is None else format(value, fmt) + unit


def markdown(report: dict[str, Any]) -> str:
    sides: list[dict[str, Any]] = report["sides"]
    head = "| | " + " | ".join(s["name"] for s in sides) + (" | nanoGPT / eemicrogpt |" if len(sides) == 2 else " |")
    rows = [head, "|---" * (len(sides) + 1 + (len(sides) == 2)) + "|"]

    def row(label: str, cells: list[str], extra: str | None = None) -> None:
        rows.append(f"| {label} | " + " | ".join(cells) + (f" | {extra} |" if extra is not None else " |"))

    for t in THRESHOLDS:
        times = [s["time_to"][f"{t:.2f}"] for s in sides]
        ratio = f"{times[0] / times[1]:.1f}x" if len(times) == 2 and None not in times and times[1] > 0 else "-"
        row(f"s of training to val {t:.2f}", [_cell(v, ".1f", "not reached") for v in times],
            ratio if len(sides) == 2 else None)
    pad = "" if len(sides) == 2 else None
    for b in BUDGETS:
        row(f"best val in {b:g} s", [_cell(s["best_within"][f"{b:g}"], ".4f", "-") for s in sides], pad)
    row("final val (steps, training s)", [f"{_cell(s['final_val_loss'], '.4f', '-')} ({s['steps']:,}, "
                                          f"{s['train_seconds']:.1f} s)" for s in sides], pad)
    row("evaluated every", [_cell(s["median_eval_interval_s"], ".1f", "-", " s") for s in sides], pad)
    row("threads", [s["threads"] for s in sides], pad)
    lines = [f"{report['title']}: {report['cpu']}; commit {report['commit']}; Python {report['python']}, "
             f"PyTorch {report['torch']}, eemicrogpt {report['eemicrogpt']}.", ""]
    lines += [f"- {s['name']}: {s['label']}" for s in sides]
    lines += [f"- {s['name']}: {note}" for s in sides for note in s["notes"]]
    lines += ["", *rows]
    if report["smoke"]:
        lines += ["", "SMOKE RUN: a few iterations on a slice of the file; these numbers measure nothing."]
    return "\n".join(lines)


# ---- command line --------------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA,
                   help="the text (default: ../shared/data/tinyshakespeare.txt beside the checkout)")
    p.add_argument("--threads", type=int, default=2, help="PyTorch threads (torch.set_num_threads; default 2)")
    p.add_argument("--eval-seconds", type=float, default=1.0,
                   help="seconds of training between evaluations, at least (1.0)")
    p.add_argument("--eval-spacing", type=float, default=0.05,
                   help="or this fraction of the training time so far, when longer (0.05)")
    p.add_argument("--max-iters", type=int, default=None,
                   help="PyTorch iterations, lr_decay_iters with them (default: the recipe's 2,000)")
    p.add_argument("--bias", action="store_true", help="biases in LayerNorms and Linears (GPTConfig's default)")
    p.add_argument("--emg-config", type=Path, default=DEFAULT_EMG_CONFIG,
                   help="the eemicrogpt config (default: configs/shakespeare_char_cpu.yaml)")
    p.add_argument("--emg-data", type=Path, default=None, help="eemicrogpt's data file (default: --data)")
    p.add_argument("--emg-log-every", type=int, default=100,
                   help="eemicrogpt steps between log lines, i.e. between the checkpoints it writes (100)")
    p.add_argument("--emg-threads", default=None, help="eemicrogpt's --threads (default: its own, auto)")
    p.add_argument("--emg-arg", action="append", default=[], metavar="ARG",
                   help="one more argument for `eemicrogpt train` (repeat it: --emg-arg=--text)")
    p.add_argument("--sides", nargs="+", choices=("torch", "eemicrogpt"), default=["torch", "eemicrogpt"])
    p.add_argument("--work", type=Path, default=None,
                   help="a new directory for the eemicrogpt run, kept (default: a temporary one, removed)")
    p.add_argument("--smoke", action="store_true",
                   help=f"{SMOKE_ITERS} steps a side on the first {SMOKE_CHARS:,} characters: seconds, no result")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = p.parse_args(argv)
    for name in ("threads", "max_iters", "emg_log_every"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    for name in ("eval_seconds", "eval_spacing"):
        if not getattr(args, name) >= 0:
            p.error(f"--{name.replace('_', '-')} must be at least 0, got {getattr(args, name)}")
    return args


def _versions() -> dict[str, str]:
    from eemicrogpt_core._version import __version__

    return {"python": platform.python_version(), "torch": str(_torch().__version__), "eemicrogpt": __version__}


def run(args: argparse.Namespace) -> dict[str, Any]:
    def say(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    recipe = Recipe(bias=args.bias)
    if args.max_iters is not None:
        recipe = replace(recipe, max_iters=args.max_iters, lr_decay_iters=args.max_iters)
    log_every = args.emg_log_every

    def schedule() -> Schedule:  # a new one per side
        return Schedule(0.0, 0.0) if args.smoke else Schedule(args.eval_seconds, args.eval_spacing)

    limit = SMOKE_CHARS if args.smoke else None
    if args.smoke:
        recipe = replace(recipe, max_iters=SMOKE_ITERS, lr_decay_iters=SMOKE_ITERS, warmup_iters=2)
        log_every = SMOKE_LOG_EVERY  # and the schedule evaluates at every chance
    text = read_text(args.data, limit)
    emg_data = args.emg_data or args.data
    emg_text = text if emg_data == args.data else read_text(emg_data, limit)
    report: dict[str, Any] = {"title": "nanoGPT's CPU recipe against eemicrogpt", "cpu": cpu_name(),
                              "commit": commit(), **_versions(), "smoke": args.smoke, "data": str(args.data),
                              "recipe": asdict(recipe), "sides": []}
    work = _work_dir(args) if "eemicrogpt" in args.sides else None  # checked before anything trains
    try:
        if "torch" in args.sides:
            say(f"PyTorch: nanoGPT's recipe on {args.data} ({len(text):,} characters)")
            report["sides"].append(run_torch(text, recipe, args.threads, schedule(), say).summary())
        if work is not None:
            extra = ["--log-every", str(log_every)]
            if args.emg_threads is not None:
                extra += ["--threads", str(args.emg_threads)]
            if args.smoke:  # the slice as its own file, and a few steps
                emg_data = work / "smoke-data.txt"
                emg_data.write_text(emg_text, encoding="utf-8")
                extra += ["--steps", str(SMOKE_ITERS)]
            say(f"eemicrogpt: {args.emg_config} on {emg_data}")
            side = run_eemicrogpt(args.emg_config, emg_data, emg_text, work, [*extra, *args.emg_arg],
                                  args.threads, recipe.block_size, schedule(), say)
            report["sides"].append(side.summary())
    finally:
        if work is not None and args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return report


def _work_dir(args: argparse.Namespace) -> Path:
    """A new directory for the eemicrogpt run: --work (which must not exist yet) or a temporary one."""
    if not args.emg_config.is_file():
        raise BenchError(f"{args.emg_config}: no such config (pass --emg-config PATH)")
    if args.work is None:
        return Path(tempfile.mkdtemp(prefix="nanogpt-recipe-"))
    try:
        args.work.mkdir(parents=True)  # a new directory: nothing of anyone else's is written into
    except FileExistsError:
        raise BenchError(f"--work {args.work} exists; give a new directory") from None
    except OSError as e:
        raise BenchError(f"--work {args.work}: cannot create it ({e.strerror})") from None
    return args.work


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = run(args)
    except BenchError as e:
        print(f"nanogpt_recipe: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
