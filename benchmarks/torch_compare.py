"""Side by side: an idiomatic PyTorch implementation of the eemicrogpt model against our backends.

Float32. PyTorch runs autograd with torch.optim.Adam (betas 0.85/0.99, eps 1e-8) over padded [B, context]
batches (padding ignored by the loss, causal mask), which is how one would write it, in its best
configuration per case: every combination of 1 or --threads threads, fused or plain Adam, eager or
torch.compile is timed first (a short tuning run each, after a warm-up that includes compiling) and the
fastest takes part. The backends run the same steps on the same batches from the same initial parameters,
with --threads threads where they can split a step. Rounds interleave the contenders (A/B/C, A/B/C, ...) so
machine noise hits all alike; the table reports median us/step and us/sample per case, torch's chosen
configuration and each backend's speed-up over it.

A case is a width of the names model (--sizes: the seed's shape, 1 layer, context 16, batches of names, at
every --batch) or a named shape (--shape: `recipe` is nanoGPT's CPU Shakespeare recipe, `full` its
shakespeare_char model, or d_model,heads,layers,vocab,context,batch), which trains on random full-length
token windows: every position live, context + 1 tokens per sequence, as text training runs.

The torch model is the module `eemicrogpt export --format torch` loads into (tools/torch_model.py) with
F.cross_entropy on top, so it follows the model's shape (layers, vocabulary, context) as the core does.

    python benchmarks/torch_compare.py                 # d16..d128, avx512 and numpy_ref vs torch's best
    python benchmarks/torch_compare.py --sizes 16 32 --rounds 9 --threads 2 --no-compile --json
    python benchmarks/torch_compare.py --shape recipe --shape full --backends avx512
    python benchmarks/torch_compare.py --sizes 16 32 64 128 256 512 1024 --batch 16 128 --backends avx512
    python benchmarks/torch_compare.py --smoke --backends numpy_ref   # seconds: proves the script runs
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # before numpy/torch load
    os.environ.setdefault(_var, "1")
# Rounds interleave torch and our thread pools on the same cores: OpenMP workers that spin-wait after torch's
# 2-thread steps would take a core from the next contender (avx512 2-thread steps ran 1.5-4.7x slower with
# active waiting). Passive waiting makes idle workers sleep at once.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from eemicrogpt_core.backends.backend import TrainState  # noqa: E402
from eemicrogpt_core.backends.registry import load_registry, open_session  # noqa: E402
from eemicrogpt_core.data.names import BatchSampler, encode, read_names  # noqa: E402
from eemicrogpt_core.model.optim import ADAM_BETA1, ADAM_BETA2, ADAM_EPS, lr_schedule  # noqa: E402
from eemicrogpt_core.model.shape import ModelShape, default_heads, init_params, views  # noqa: E402
from eemicrogpt_core.model.vocab import Vocabulary  # noqa: E402
from eemicrogpt_core.tools.bench import NAMED_SHAPES, full_windows, parse_shape, step_flops  # noqa: E402
from eemicrogpt_core.tools.torch_model import to_torch  # noqa: E402

DEFAULT_NAMES = Path(__file__).resolve().parents[2] / "shared" / "data" / "names.txt"
STEPS_PER_ROUND = {16: 40, 32: 30, 64: 12, 128: 4}  # names, batch 16: a few ms to ~0.1 s per contender per round
# Other cases: steps per contender per round from the step's FLOPs (tools/bench.step_flops at full length), about
# 0.1-0.3 s of work at 100 GFLOP/s; the largest (the full shape: ~1.1 TFLOP a step) run 1 step per round.
ROUND_FLOPS = 2e10
LR, LR_FULL_WIDTH = 0.003, 128  # case_lr
MAX_STEPS_PER_ROUND = 40
TUNING_REPEATS = 3  # timed runs of one round's steps per torch configuration (median kept)
SMOKE_STEPS_PER_ROUND = 2  # --smoke: enough to run every code path, too few to time anything


@dataclass(frozen=True)
class Case:
    """One row of the table: a shape, its batch, and whether it trains on names or random full windows."""

    label: str
    shape: ModelShape
    batch: int
    names: bool

    def steps_per_round(self, smoke: bool) -> int:
        if smoke:
            return SMOKE_STEPS_PER_ROUND
        if self.names and self.batch == 16 and self.shape.d_model in STEPS_PER_ROUND:
            return STEPS_PER_ROUND[self.shape.d_model]
        full = np.full((1, self.batch), self.shape.seq_len)
        return int(np.clip(ROUND_FLOPS // step_flops(self.shape, full)[0], 1, MAX_STEPS_PER_ROUND))

    def batches(self, steps: int, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        data = encode(names, Vocabulary.names(), self.shape.context)[0] if self.names else full_windows(self.shape)
        return BatchSampler(data, self.batch, seed=1234, stream=7).sample(steps)


def case_lr(shape: ModelShape) -> float:
    """The peak learning rate of a case: 0.003 to d128, then falling as 1/width. Adam's first step moves every
    weight by about the rate whatever its gradient, so at 0.003 a d1024 model's loss leaps from 3.9 to ~50 on the
    first step and the loss comparison would measure that chaos, not whether the contenders agree."""
    return LR * min(1.0, LR_FULL_WIDTH / shape.d_model)


def names_case(d_model: int, batch: int) -> Case:
    # the heads `eemicrogpt bench` uses (8 at d128); the names model: 1 layer, vocabulary 27, context 16
    return Case(f"d{d_model}", ModelShape(d_model, default_heads(d_model)), batch, names=True)


def shape_case(spec: str) -> Case:
    """`recipe`, `full` or d_model,heads,layers,vocab,context,batch; ValueError with a one-line reason."""
    label, shape, batch = parse_shape(spec)
    return Case(label, shape, batch, names=False)


def _torch():
    try:
        import torch
    except ImportError:
        sys.exit("torch is not installed: pip install torch==2.13.0 (this comparison needs it)")
    return torch


@dataclass(frozen=True)
class TorchConfig:
    threads: int
    fused_adam: bool
    compiled: bool

    @property
    def label(self) -> str:
        adam = "fused" if self.fused_adam else "plain"
        return f"{self.threads}t {adam} Adam {'compiled' if self.compiled else 'eager'}"


class TorchRun:
    """One torch contender: model, optimiser and configuration, stepping through the shared batches."""

    def __init__(self, torch, shape: ModelShape, params: np.ndarray, config: TorchConfig, idx, tgt,
                 lrs: np.ndarray) -> None:
        self.torch, self.config, self.idx, self.tgt, self.lrs = torch, config, idx, tgt, lrs
        self.shape = shape
        self.model = build_torch_model(torch, shape, params)
        if config.compiled:
            # Every model here is a new class, so without a reset dynamo's per-function cache fills after 8 of
            # them and the rest would silently run eager under the label `compiled`.
            torch._dynamo.reset()
        self.forward = torch.compile(self.model) if config.compiled else self.model
        self.reset(params)

    def reset(self, params: np.ndarray) -> None:
        """Weights back to params and a fresh optimiser (a compiled graph is kept: it reads the same modules)."""
        load_weights(self.torch, self.model, self.shape, params)
        self.opt = self.torch.optim.Adam(self.model.parameters(), lr=float(self.lrs[0]),
                                         betas=(ADAM_BETA1, ADAM_BETA2), eps=ADAM_EPS, fused=self.config.fused_adam)

    def run(self, lo: int, hi: int) -> np.ndarray:
        self.torch.set_num_threads(self.config.threads)
        out = np.empty(hi - lo, np.float32)
        for i in range(lo, hi):
            for group in self.opt.param_groups:
                group["lr"] = float(self.lrs[i])
            self.opt.zero_grad(set_to_none=True)
            loss = self.forward(self.idx[i], self.tgt[i])
            loss.backward()
            self.opt.step()
            out[i - lo] = loss.item()
        return out


def tune_torch(torch, shape: ModelShape, params: np.ndarray, idx, tgt, lrs: np.ndarray, steps: int,
               configs: list[TorchConfig]) -> tuple[TorchConfig, dict[str, float]]:
    """Time every configuration on the first `steps` batches (after a warm-up run); the fastest wins."""
    timings = {}
    for config in configs:
        runner = TorchRun(torch, shape, params, config, idx, tgt, lrs)
        runner.run(0, min(2, steps))  # lazy init and, when compiled, the compilation itself
        runs = []
        for _ in range(TUNING_REPEATS):
            start = time.perf_counter()
            runner.run(0, steps)
            runs.append((time.perf_counter() - start) / steps * 1e6)
        timings[config.label] = statistics.median(runs)
    best = min(configs, key=lambda c: timings[c.label])
    return best, timings


def build_torch_model(torch, shape: ModelShape, params: np.ndarray):
    """The exported model's module (tools/torch_model.py) holding `params`, with the loss a user adds."""
    F = torch.nn.functional

    class WithLoss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gpt = to_torch(params, shape)

        def forward(self, idx, targets):
            logits = self.gpt(idx)
            return F.cross_entropy(logits.reshape(-1, shape.vocab), targets.reshape(-1), ignore_index=-1)

    return WithLoss()


def load_weights(torch, model, shape: ModelShape, params: np.ndarray) -> None:
    """Copy our flat parameter buffer into the module's weights (named as in the layout: layers.0.Wq, ...)."""
    with torch.no_grad():
        for name, w in views(shape, params).items():
            model.gpt.get_parameter(name).copy_(torch.from_numpy(w.copy()))


def torch_batches(torch, tokens: np.ndarray, lengths: np.ndarray):
    """Inputs [n, B, context] and targets with -1 on padding (ignored by the loss): a row of `length` tokens
    has length - 1 predictions."""
    idx = torch.from_numpy(tokens[:, :, :-1].astype(np.int64))
    tgt = torch.from_numpy(tokens[:, :, 1:].astype(np.int64))
    live = torch.arange(tokens.shape[2] - 1)[None, None, :] <= torch.from_numpy(lengths.astype(np.int64))[..., None] - 2
    return idx, tgt.masked_fill(~live, -1)


def compare(torch, case: Case, batches, lrs: np.ndarray, backends: list[str], rounds: int,
            threads: int, torch_configs: list[TorchConfig]) -> dict:
    shape = case.shape
    tokens, lengths = batches
    steps = tokens.shape[0] // rounds
    params = init_params(shape, seed=0)
    idx, tgt = torch_batches(torch, tokens, lengths)
    best, tuning = tune_torch(torch, shape, params, idx, tgt, lrs, steps, torch_configs)
    registry = load_registry()
    sessions = {}
    for name in backends:
        entry = registry.select(name, shape, case.batch)
        sessions[name] = open_session(entry, shape, case.batch, threads=threads)
        sessions[name].set_state(TrainState.fresh(params))
    torch_run = TorchRun(torch, shape, params, best, idx, tgt, lrs)
    torch_run.run(0, min(2, steps))  # lazy init and compilation before the timed rounds
    torch_run.reset(params)

    times: dict[str, list[float]] = {name: [] for name in ["torch", *backends]}
    losses: dict[str, list[np.ndarray]] = {name: [] for name in times}
    for r in range(rounds):
        lo, hi = r * steps, (r + 1) * steps
        for name in times:  # interleaved: every contender runs this round's steps back to back
            start = time.perf_counter()
            if name == "torch":
                got = torch_run.run(lo, hi)
            else:
                got = sessions[name].train_steps(tokens[lo:hi], lengths[lo:hi], lrs[lo:hi])
            times[name].append((time.perf_counter() - start) / steps * 1e6)
            losses[name].append(got)
    sessions_threads = {name: session.threads for name, session in sessions.items()}
    for session in sessions.values():
        session.close()
    # Round 0 includes warm-up (allocation, first touches, torch's lazy init): drop it from the medians.
    med = {name: statistics.median(t[1:] if len(t) > 1 else t) for name, t in times.items()}
    ref = np.concatenate(losses["torch"])
    return {
        "case": case.label,
        "shape": shape.describe(),
        "d_model": shape.d_model,
        "batch": case.batch,
        "data": "names" if case.names else "random full-length windows",
        "steps": steps * rounds,
        "steps_per_round": steps,
        "threads": {name: sessions_threads[name] for name in backends},
        "torch_config": asdict(best),
        "torch_tuning_us_per_step": tuning,
        "us_per_step": med,
        "us_per_sample": {name: t / case.batch for name, t in med.items()},
        "speedup_vs_torch": {name: med["torch"] / med[name] for name in backends},
        "max_loss_diff_vs_torch_first_10": {
            name: float(np.max(np.abs(np.concatenate(losses[name])[:10] - ref[:10]))) for name in backends
        },
    }


def crossovers(results: list[dict], backends: list[str]) -> list[str]:
    """Per backend and names batch: the narrowest width from which torch is faster, if there is one."""
    out = []
    for batch in sorted({row["batch"] for row in results if row["data"] == "names"}):
        rows = sorted((row for row in results if row["data"] == "names" and row["batch"] == batch),
                      key=lambda row: row["d_model"])
        if len(rows) < 2:
            continue
        for b in backends:
            slower = [row["d_model"] for row in rows if row["speedup_vs_torch"][b] < 1]
            where = f"torch is faster from d{slower[0]}" if slower else "none: faster than torch at every width"
            out.append(f"crossover, batch {batch}, {b}: {where}")
    return out


def print_table(results: list[dict], backends: list[str], threads: int, rounds: int, version: str) -> None:
    print(f"torch {version}, float32, backends on up to {threads} threads; median over {rounds - 1} interleaved "
          "rounds (speed-up = torch at its best / backend)")
    head = ["case", "batch", "torch us/step", *(f"{b} us/step" for b in backends), "torch us/sample",
            *(f"{b} us/sample" for b in backends), *(f"x {b}" for b in backends)]
    print(" | ".join(head))
    for row in results:
        cells = [row["case"], str(row["batch"]), f"{row['us_per_step']['torch']:.1f}"]
        cells += [f"{row['us_per_step'][b]:.1f}" for b in backends]
        cells += [f"{row['us_per_sample'][name]:.2f}" for name in ("torch", *backends)]
        cells += [f"{row['speedup_vs_torch'][b]:.2f}x" for b in backends]
        print(" | ".join(cells))
    for row in results:
        print(f"{row['case']} b{row['batch']} ({row['shape']}, {row['data']}, {row['steps_per_round']} steps per "
              f"round): torch's best: {TorchConfig(**row['torch_config']).label}; backends' threads {row['threads']}")
    for row in results:
        diffs = ", ".join(f"{b} {v:.1e}" for b, v in row["max_loss_diff_vs_torch_first_10"].items())
        print(f"{row['case']} b{row['batch']}: largest loss difference vs torch over the first 10 steps: {diffs}")
    for line in crossovers(results, backends):
        print(line)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=None,
                    help="names-model widths (default 16 32 64 128 when no --shape is given)")
    ap.add_argument("--batch", type=int, nargs="+", default=[16], help="batches for --sizes (each one a case)")
    ap.add_argument("--shape", action="append", default=[],
                    help=f"{', '.join(NAMED_SHAPES)} or d_model,heads,layers,vocab,context,batch: random "
                         "full-length windows (repeatable)")
    ap.add_argument("--backends", nargs="+", default=["avx512", "numpy_ref"])
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (the first is warm-up)")
    ap.add_argument("--threads", type=int, default=2, help="threads for our backends and torch's 2-thread trials")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile trials (slow to compile)")
    ap.add_argument("--names", type=Path, default=DEFAULT_NAMES)
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument("--smoke", action="store_true",
                    help="a tiny run that proves the script works (d16 unless --shape is given, 2 rounds of 2 steps, "
                         "1 thread, eager torch); its timings mean nothing")
    args = ap.parse_args(argv)
    if args.smoke:
        args.rounds, args.threads, args.no_compile = 2, 1, True
        if not args.shape:
            args.sizes = [16]
    if args.sizes is None:
        args.sizes = [] if args.shape else [16, 32, 64, 128]
    if args.rounds < 2:
        ap.error("--rounds must be >= 2 (the first round is warm-up)")
    if args.threads < 1:
        ap.error("--threads must be >= 1")
    if min(args.batch) < 1:
        ap.error("--batch must be >= 1")
    cases = [names_case(d, batch) for batch in args.batch for d in args.sizes]
    try:
        cases += [shape_case(spec) for spec in args.shape]
    except ValueError as e:
        ap.error(f"--{e}")
    if args.sizes and not args.names.is_file():
        ap.error(f"names file not found: {args.names} (pass --names)")
    torch = _torch()
    configs = [TorchConfig(t, fused, compiled) for t, fused, compiled in itertools.product(
        sorted({1, args.threads}), (False, True), (False,) if args.no_compile else (False, True))]
    names = read_names(args.names, drop_invalid=True, vocab=Vocabulary.names()).names if args.sizes else []
    results = []
    for case in cases:
        steps = case.steps_per_round(args.smoke) * args.rounds
        lrs = lr_schedule(1, steps, steps, case_lr(case.shape))
        results.append(compare(torch, case, case.batches(steps, names), lrs, args.backends, args.rounds,
                               args.threads, configs))
    if args.json:
        print(json.dumps({"torch_version": torch.__version__, "threads": args.threads, "results": results}, indent=2))
    else:
        print_table(results, args.backends, args.threads, args.rounds, torch.__version__)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
