"""benchmarks/nanogpt_recipe.py: its held-out evaluation, the recipe's schedule, optimizer groups and model, the
time-to-threshold bookkeeping, and a --smoke run of both sides through the real CLI (the timings measure
nothing; the full comparison is run by hand on a quiet machine, see benchmarks/README.md)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from extras import import_extra

torch = import_extra("torch", "pip install torch")

from eemicrogpt_core.model.sampling import forward_logits  # noqa: E402
from eemicrogpt_core.model.shape import ModelShape, init_params  # noqa: E402
from eemicrogpt_core.model.vocab import Vocabulary  # noqa: E402
from eemicrogpt_core.tools.torch_model import to_torch  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "nanogpt_recipe.py"
_spec = importlib.util.spec_from_file_location("nanogpt_recipe", SCRIPT)
bench = importlib.util.module_from_spec(_spec)
sys.modules["nanogpt_recipe"] = bench  # dataclasses resolve annotations through sys.modules
_spec.loader.exec_module(bench)


def _ce(logits: np.ndarray, target: int) -> float:
    z = logits - logits.max()
    return float(np.log(np.exp(z).sum()) - z[target])


@pytest.mark.parametrize("n_tokens", [3 * 8 + 1, 3 * 8 + 6, 5])  # whole windows only; a short last one; one short
def test_held_out_loss_predicts_every_position_once(n_tokens: int) -> None:
    """A model whose logits depend on the input token and on the position in its window: the mean must be that
    of predicting token j from token j-1 at position (j-1) mod T, for every j >= 1, each once."""
    block, vocab = 8, 7
    rng = np.random.default_rng(0)
    table, pos_bias = rng.normal(size=(vocab, vocab)), rng.normal(size=(block, vocab))
    val = rng.integers(0, vocab, n_tokens)
    seen: list[tuple[int, int]] = []

    def logits_of(x: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(x.shape))
        return torch.from_numpy(table)[x] + torch.from_numpy(pos_bias)[: x.shape[1]]

    got = bench.held_out_loss(logits_of, torch.from_numpy(val), block, windows=2)
    want = np.mean([_ce(table[val[j - 1]] + pos_bias[(j - 1) % block], val[j]) for j in range(1, n_tokens)])
    assert got == pytest.approx(want, rel=1e-12)  # float64 logits: only the summation order differs
    assert sum(b * t for b, t in seen) == n_tokens - 1
    assert all(t == block for _, t in seen[:-1]) and all(b <= 2 for b, _ in seen)


def test_held_out_loss_of_an_eemicrogpt_text_model_matches_the_reference() -> None:
    """The eemicrogpt side's path (its parameters through to_torch, its text tokens) against the core's float64
    reference forward, window by window. Tolerance: float32 against float64 in a 2-layer d16 forward; the
    measured relative difference was 1e-8 to 7e-8 over five seeds;
    1e-5 leaves room for other BLAS builds."""
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
    vocab = Vocabulary(tuple(sorted(set(text))), with_boundary=False)
    shape = ModelShape(d_model=16, n_heads=4, n_layers=2, vocab=vocab.size, context=8)
    params = init_params(shape, 3)
    tokens = np.array(bench.run_tokens(vocab, text))
    got = bench.held_out_loss(to_torch(params, shape).eval(), torch.from_numpy(tokens), shape.context)
    losses = []
    for start in range(0, len(tokens) - 1, shape.context):
        window = tokens[start:start + shape.context + 1]
        logits = forward_logits(params, shape, window[None, :-1])[0]
        losses += [_ce(logits[p], window[p + 1]) for p in range(len(window) - 1)]
    assert len(losses) == len(tokens) - 1
    assert got == pytest.approx(float(np.mean(losses)), rel=1e-5)


def test_run_tokens_reads_newlines_as_each_vocabulary_does() -> None:
    lines = Vocabulary(tuple("abm"))
    assert bench.run_tokens(lines, "ab\nma") == [0, 1, lines.boundary, 2, 0]
    text = Vocabulary(tuple("\nab"), with_boundary=False)
    assert bench.run_tokens(text, "a\nb") == [1, 0, 2]
    with pytest.raises(bench.BenchError, match="'z'"):
        bench.run_tokens(text, "a\nz")


def test_split_is_nanogpts() -> None:
    text = "".join(chr(97 + i % 26) for i in range(1001))
    train, val = bench.split_text(text)
    assert train + val == text and len(train) == int(1001 * 0.9)
    assert list(bench.char_vocab("cabca")) == ["a", "b", "c"]


def test_lr_warms_up_then_follows_the_cosine_to_min_lr() -> None:
    r = bench.Recipe()
    lrs = [bench.lr_at(it, r) for it in range(r.max_iters + 50)]
    warm = lrs[: r.warmup_iters]
    assert all(a < b for a, b in itertools.pairwise(warm)) and 0 < warm[0] < r.learning_rate / r.warmup_iters * 1.01
    assert lrs[r.warmup_iters] == pytest.approx(r.learning_rate)
    decay = lrs[r.warmup_iters: r.lr_decay_iters]
    assert all(a > b for a, b in itertools.pairwise(decay))
    middle = (r.warmup_iters + r.lr_decay_iters) // 2
    assert lrs[middle] == pytest.approx((r.learning_rate + r.min_lr) / 2)
    assert set(lrs[r.lr_decay_iters:]) == {r.min_lr}


@pytest.mark.parametrize("bias", [False, True])
def test_weight_decay_falls_on_matrices_only(bias: bool) -> None:
    recipe = bench.Recipe(n_layer=2, n_embd=32, bias=bias)
    model = bench.build_gpt(recipe, 11)
    decay, no_decay = bench.adamw(model, recipe).param_groups
    assert decay["weight_decay"] == recipe.weight_decay and no_decay["weight_decay"] == 0
    listed = [id(p) for p in decay["params"] + no_decay["params"]]
    assert sorted(listed) == sorted(id(p) for p in model.parameters()) and len(set(listed)) == len(listed)
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    assert model.head.weight is model.tok.weight
    biases = [n for n, _ in model.named_parameters() if n.endswith("bias")]
    # LayerNorm gains are always 1-D; with bias every LayerNorm and Linear (but the tied head) adds one
    assert len(no_decay["params"]) == 2 * recipe.n_layer + 1 + len(biases)
    assert len(biases) == (0 if not bias else (2 * recipe.n_layer + 1) + 4 * recipe.n_layer)


def test_gpt_is_causal_and_shaped() -> None:
    recipe = bench.Recipe(n_layer=2, n_embd=32)
    model = bench.build_gpt(recipe, 11).eval()
    x = torch.randint(11, (2, recipe.block_size))
    y = x.clone()
    y[:, 40:] = (y[:, 40:] + 1) % 11
    with torch.no_grad():
        a, b = model(x), model(y)
    assert a.shape == (2, recipe.block_size, 11)
    assert torch.equal(a[:, :40], b[:, :40]) and not torch.allclose(a[:, 40:], b[:, 40:])


def test_time_to_and_best_within() -> None:
    side = bench.Side("x", "x", "1", [bench.Evaluation(s, i, v) for i, (s, v) in
                                       enumerate([(10.0, 2.5), (50.0, 2.1), (61.0, 1.95), (90.0, 1.99),
                                                  (200.0, 1.87), (400.0, 1.7)])])
    assert [side.time_to(t) for t in bench.THRESHOLDS] == [50.0, 61.0, 200.0, 200.0]
    assert side.time_to(1.5) is None
    assert [side.best_within(b) for b in bench.BUDGETS] == [2.1, 1.87]
    assert side.best_within(5) is None


def test_schedule_bounds_the_gap_and_lands_before_each_budget() -> None:
    """A simulated 300 s run of 37.6 ms steps (the recipe's on the Zen 4 machines): gaps of at least `every`
    and at most max(every, spacing x time) plus a step, an evaluation in the last step before each budget, and
    about 75 evaluations in all (the docstring's figure)."""
    schedule, step, t, times = bench.Schedule(), 0.0376, 0.0, []
    while t < 300:
        t += step
        if schedule.due(t, step):
            times.append(t)
            schedule.evaluated(t)
    gaps = list(itertools.pairwise(times))
    assert all(b - a <= max(schedule.every, schedule.spacing * a) + step + 1e-9 for a, b in gaps)
    assert sum(b - a < schedule.every - 1e-9 for a, b in gaps) <= 2  # only the evaluations before a budget
    for budget in bench.BUDGETS:
        assert max(x for x in times if x <= budget) > budget - step
    assert 60 <= len(times) <= 90


def _write_checkpoint(run_dir: Path, content: bytes, mtime_ns: int) -> None:
    """As the trainer does: a new file renamed over checkpoint.npz (distinct mtimes: a test cannot rely on the
    file system's timestamp granularity)."""
    tmp = run_dir / ".checkpoint.npz.tmp"
    tmp.write_bytes(content)
    os.utime(tmp, ns=(mtime_ns, mtime_ns))
    os.replace(tmp, run_dir / "checkpoint.npz")


def test_checkpoint_keeper_keeps_what_the_schedule_asks_for(tmp_path: Path) -> None:
    run_dir, keep = tmp_path / "run", tmp_path / "keep"
    run_dir.mkdir()
    keep.mkdir()
    keeper = bench.CheckpointKeeper(run_dir, keep, bench.Schedule(every=1.0, spacing=0.05))
    keeper.poll()  # nothing written yet
    for i, content in enumerate([b"A", b"B", b"C", b"D"], start=1):
        with (run_dir / "metrics.jsonl").open("a") as f:  # step 100 i after 0.5 i s of training
            f.write(json.dumps({"step": 100 * i, "us_per_step": 5000.0}) + "\n")
        _write_checkpoint(run_dir, content, 10**18 + i * 10**9)
        keeper.poll()
        keeper.poll()  # the same file again: nothing new
    keeper.poll(final=True)
    keeper.poll(final=True)
    # A at 0.5 s (the first is due), B at 1.0 s skipped (due at 1.5 s), C at 1.5 s, D the last
    assert [p.read_bytes() for p in sorted(keep.iterdir())] == [b"A", b"C", b"D"]
    assert (run_dir / "checkpoint.npz").read_bytes() == b"D"


def test_smoke_run_of_both_sides(names_file: Path, tmp_path: Path) -> None:
    """Both sides end to end: PyTorch's loop and `eemicrogpt train` (lines format on names: text mode is a
    separate config) with its checkpoints caught and evaluated."""
    work = tmp_path / "work"
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--json", "--quiet", "--threads", "1",
                           "--data", str(names_file), "--emg-config", str(REPO / "configs" / "d16.yaml"),
                           "--work", str(work)], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["smoke"] and report["cpu"] and report["commit"] != "unknown"
    torch_side, emg = report["sides"]
    assert torch_side["steps"] == bench.SMOKE_ITERS and torch_side["threads"] == "1"
    assert [e["step"] for e in torch_side["evaluations"]] == list(range(1, bench.SMOKE_ITERS + 1))
    assert emg["steps"] == bench.SMOKE_ITERS and emg["train_seconds"] > 0
    logged = {json.loads(line)["step"] for line in (work / "eemicrogpt-run" / "metrics.jsonl").open()}
    assert emg["evaluations"] and {e["step"] for e in emg["evaluations"]} <= logged
    for side in report["sides"]:
        seconds = [e["seconds"] for e in side["evaluations"]]
        assert seconds == sorted(seconds) and seconds[-1] == pytest.approx(side["train_seconds"])
        assert all(0 < e["val_loss"] < 2 * math.log(100) for e in side["evaluations"])
    table = bench.markdown(report)
    assert "| s of training to val 2.00 |" in table and "| s of training to val 1.88 |" in table
    assert "SMOKE RUN" in table


def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, names_file: Path) -> None:
    missing = tmp_path / "nope.txt"
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--data", str(missing)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        f"nanogpt_recipe: error: {missing}: no such file (pass --data PATH)"]
    work = tmp_path / "mine"
    work.mkdir()
    (work / "keep.txt").write_text("x")
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--data", str(names_file), "--emg-config",
                           str(REPO / "configs" / "d16.yaml"), "--work", str(work)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "exists; give a new directory" in done.stderr
    assert [p.name for p in work.iterdir()] == ["keep.txt"]
