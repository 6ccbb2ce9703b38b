"""Generation speed: characters per second of `eemicrogpt sample`'s generator on one core, per model shape.

Random-initialised models of the given shapes (speed does not depend on what the weights learned, except
through where names end: names are drawn to their full length here, the slowest case). For each shape:

- text, within the context: one continuation of `context - 1` characters from a one-character prompt
  (one cached position per character);
- text, long: one continuation of --chars characters, past the context with the default slide (a full
  window drops a quarter of its characters at once), with nanoGPT's crop before every character (slide 1:
  one full window forward each) and, with --slide S, S at a time;
- names: --names names of up to `context` characters, drawn in batches; characters per second counts every
  character drawn.

The median of --repeats timed runs after one warm-up. BLAS is set to one thread before numpy loads (and the
generator holds OpenBLAS to one thread anyway). Timings on a busy machine mean little: run it on a quiet one.

    python benchmarks/generate_speed.py                       # d128/4 layers/context 64 and d384/6/64
    python benchmarks/generate_speed.py --smoke            # d16/1 layer/context 16, 100 characters, once
    python benchmarks/generate_speed.py --slide 8 --json
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # before numpy loads
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import string  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

from eemicrogpt_core.model.choice import Choice  # noqa: E402
from eemicrogpt_core.model.sampling import sample_names, text_continuations  # noqa: E402
from eemicrogpt_core.model.shape import ModelShape, init_params  # noqa: E402
from eemicrogpt_core.model.vocab import Vocabulary  # noqa: E402

# d_model, heads, layers, vocab, context: nanoGPT's CPU recipe and its full Shakespeare model.
DEFAULT_SHAPES = ("128,8,4,65,64", "384,6,6,65,256")
CHOICE = Choice(0.8, None)


def parse_shape(text: str) -> ModelShape:
    d, heads, layers, vocab, context = (int(x) for x in text.split(","))
    return ModelShape(d, heads, n_layers=layers, vocab=vocab, context=context)


def text_vocab(size: int) -> Vocabulary:
    symbols = sorted(set("\n " + string.ascii_letters + string.digits + string.punctuation))[:size]
    return Vocabulary(tuple(symbols), with_boundary=False)


def names_vocab(size: int) -> Vocabulary:
    return Vocabulary(tuple(sorted(set(string.ascii_letters + string.digits + string.punctuation))[: size - 1]))


def median_rate(work: Callable[[], int], repeats: int) -> float:
    """Characters per second: the median over repeats of one call's characters / seconds, after a warm-up."""
    work()
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        chars = work()
        rates.append(chars / (time.perf_counter() - start))
    return statistics.median(rates)


def measure(shape: ModelShape, chars: int, names: int, slide: int, repeats: int) -> dict:
    params = init_params(shape, seed=0)
    text, lists = text_vocab(shape.vocab), names_vocab(shape.vocab)

    def continuation(length: int, window_slide: int | None) -> Callable[[], int]:
        def work() -> int:
            (out,) = text_continuations(params, shape, text, "\n", length, 1, CHOICE, seed=1, slide=window_slide)
            return sum(1 for _ in out)
        return work

    def names_work() -> int:
        drawn = sample_names(params, shape, lists, names, CHOICE, seed=1)
        return sum(len(name) + 1 for name in drawn)  # the boundary that ends a name is drawn too

    row = {"shape": shape.describe(), "text_in_context": median_rate(continuation(shape.context - 1, 1), repeats),
           f"text_{chars}": median_rate(continuation(chars, None), repeats),
           f"text_{chars}_slide_1": median_rate(continuation(chars, 1), repeats),
           "names": median_rate(names_work, repeats)}
    if slide > 0:
        row[f"text_{chars}_slide_{slide}"] = median_rate(continuation(chars, slide), repeats)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", action="append", help="d_model,heads,layers,vocab,context (repeatable)")
    parser.add_argument("--chars", type=int, default=500, help="characters of the long text continuation")
    parser.add_argument("--names", type=int, default=1000, help="names drawn per timed run")
    parser.add_argument("--slide", type=int, default=0, help="also time the long continuation with this slide")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="a seconds-long run: d16/4/1/27/16, 100 characters, "
                        "50 names, one repeat (checks the script works; the figures mean nothing)")
    args = parser.parse_args()
    if args.smoke:
        args.shape, args.chars, args.names, args.repeats = ["16,4,1,27,16"], 100, 50, 1
    rows = [measure(parse_shape(s), args.chars, args.names, args.slide, args.repeats)
            for s in args.shape or DEFAULT_SHAPES]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        rates = ", ".join(f"{key} {value:,.0f}" for key, value in row.items() if key != "shape")
        print(f"{row['shape']}: characters/s {rates}")


if __name__ == "__main__":
    main()
