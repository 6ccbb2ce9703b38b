"""The `eemicrogpt` command: train, sample, backends, bench.

User errors (EemicrogptError) and bad usage print one line on stderr and exit 2; no traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from .. import __version__
from ..backends.precision import FP32, PRECISIONS
from ..backends.registry import BackendRegistry, load_registry, peak_gflops
from ..base.errors import ConfigError, EemicrogptError, describe_os_error
from ..base.paths import user_path
from ..base.shipped import description, shipped
from ..data.datafile import resolve_data_path
from ..data.names import encode, read_names, split
from ..model.sampling import MAX_NEW_TOKENS, MAX_SAMPLES, NAMES_TEMPERATURE, TEXT_TEMPERATURE, summary_sample
from ..model.shape import DEFAULT_CONTEXT, NAMES_VOCAB, ModelShape
from ..model.vocab import Vocabulary
from ..tools import bench
from ..training import runs
from ..training.checkpoint import load_checkpoint
from ..training.config import MAX_CONFIG_BATCH, MAX_D_MODEL, SETTINGS, TrainConfig, load_config
from ..training.progress import RichReporter, batch_progress, rate_text
from ..training.rundir import BEST_NAME, model_file
from ..training.trainer import PreparedData, TrainResult
from .config_options import flag_of, flags_of, with_config_options
from .sample_output import (
    DEFAULT_NEW_TOKENS,
    NAMES_N,
    TEXT_N,
    SampleOptions,
    sample_lines,
    stream,
    write_new,
)
from .versions import version_report

EXIT_USER_ERROR = 2
MAX_BENCH_REPEATS = 1000
MAX_BENCH_SECONDS = 3600.0


def _fail(message: str, code: int = EXIT_USER_ERROR) -> int:
    one_line = " ".join(message.split())
    print(f"eemicrogpt: error: {one_line}", file=sys.stderr)
    return code


def _flags_read_as_flags(params: list[Any]) -> list[Any]:
    """Options that take no value (--unique, --help) get an empty metavar: typer would otherwise show their
    type, `<bool>`, as if they took one."""
    for param in params:
        if getattr(param, "is_flag", False) and getattr(param, "metavar", "") is None:
            param.metavar = ""
    return params


def _flag_value_hint(message: str, args: list[str] | None) -> str:
    """`--unique true`: say that a flag takes no value (click only calls `true` an unexpected argument)."""
    if "extra argument" not in message:
        return ""
    words = list(args if args is not None else sys.argv[1:])
    for before, word in itertools.pairwise(words):
        if before.startswith("--") and "=" not in before and word.lower() in ("true", "false"):
            return f"; {before} is a flag and takes no value: write {before} alone to set it"
    return ""


def _escape_unencodable_output() -> None:
    """A character the terminal's encoding lacks (PYTHONIOENCODING=ascii, a C locale) is printed as a
    backslash escape (\\xe9) instead of ending the command in UnicodeEncodeError half way through a run;
    files (sample --out, the run directory) are UTF-8 whatever the terminal."""
    for out in (sys.stdout, sys.stderr):
        reconfigure = getattr(out, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(ValueError, OSError):  # a closed or detached stream: nothing to print to
                reconfigure(errors="backslashreplace")


STDOUT_NAME = "standard output"


class _NamedStdout:
    """sys.stdout, with its write errors naming it: a failed write() names no file, and "No space left on
    device" alone does not tell the user that it was the output (> /dev/full, a full disk) that failed."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as e:
            raise OSError(e.errno, e.strerror, e.filename or STDOUT_NAME) from e

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            raise OSError(e.errno, e.strerror, e.filename or STDOUT_NAME) from e

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class OneLineErrors(TyperGroup):
    """Turns user errors and usage errors into a single stderr line instead of a traceback or a panel."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_read_as_flags(super().get_params(ctx))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _flags_read_as_flags(command.get_params(ctx))
        return command

    def main(  # type: ignore[override]
        self,
        args: list[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        _escape_unencodable_output()
        if not isinstance(sys.stdout, _NamedStdout):
            sys.stdout = _NamedStdout(sys.stdout)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) else 0
        except EemicrogptError as e:
            code = _fail(str(e))
        except typer.Abort:
            code = _fail("aborted", 1)
        except OSError as e:  # what the modules did not name more precisely: still one line, never a traceback
            code = _fail(describe_os_error(e, "cannot write" if e.filename == STDOUT_NAME else "cannot access"))
        except MemoryError:
            code = _fail("out of memory; lower d_model, batch or chunk_steps (or sample fewer names)")
        except Exception as e:
            # Usage errors: typer may vendor click, so recognise them by click's exception interface.
            if not (hasattr(e, "format_message") and hasattr(e, "exit_code")):
                raise
            ctx = getattr(e, "ctx", None)
            if type(e).__name__ == "NoArgsIsHelpError" and ctx is not None:
                print(ctx.get_help())
                code = 0
            else:
                where = ctx.command_path if ctx is not None else "eemicrogpt"
                message = e.format_message()
                code = _fail(f"{where}: {message}{_flag_value_hint(message, args)} (see {where} --help)", e.exit_code)
        if standalone_mode:
            sys.exit(code)
        return code


app = typer.Typer(
    cls=OneLineErrors,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    help=f"eemicrogpt {__version__}: train tiny character-level GPTs on a CPU, fast.",
)


def _print_version(value: bool) -> None:
    if value:
        print(version_report())
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True,
                           help="print the core's and every installed backend's version, then exit")
    ] = False,
) -> None:
    pass  # the app's help text is set on the Typer above


_BACKEND_HELP = SETTINGS["backend"].help
_DATA_HELP = SETTINGS["data"].help
_BEST_HELP = "use best.npz, the checkpoint of the lowest validation loss (a run trained with --keep-best)"


def _summary(result: TrainResult, cfg: TrainConfig, console: Console) -> None:
    val = f"{result.val_loss:.4f}" if result.val_loss is not None else "-"
    step = int(result.state.step)
    console.print(
        f"done: step {step:,}/{result.total_steps:,} on {result.backend}; final train loss {result.train_loss:.4f} "
        f"(mean of last 100), val loss {val}; {result.us_per_step:,.1f} us/step, {rate_text(result.steps_per_s)}",
        highlight=False,
    )
    if result.target is not None:
        console.print(f"target: {result.target.describe()}", highlight=False)
    if result.best is not None and result.best.val_loss is not None:
        kept = f" (kept in {result.run_dir / BEST_NAME})" if cfg.keep_best and result.run_dir is not None else ""
        console.print(f"{result.best.describe()}{kept}", highlight=False)
    c = result.contention
    if c is not None and c.contended:
        loads = ", ".join(f"{x:.1f}" for x in (c.load_start, c.load_end) if x is not None)
        console.print(f"note: the machine was busy during this time-budget run ({c.slowdown:.2f}x the fastest "
                      f"warm-up step, load average {loads or 'unknown'} on {c.cpus} CPUs): its step count is "
                      "not a quiet machine's", highlight=False)
    console.print(summary_sample(result.state.params, result.shape, result.vocab, cfg.seed), highlight=False,
                  markup=False)
    if result.run_dir is not None:
        console.print(f"run directory: {result.run_dir}", highlight=False)


@app.command("train")
@with_config_options
def train_cmd(
    config: Annotated[
        str | None, typer.Option("--config", "-c", help="YAML config: a path or a shipped config's name (d16; "
                                 "`eemicrogpt configs` lists them); default: built in, equal to d64")
    ] = None,
    resume: Annotated[Path | None, typer.Option(help="continue the run in this directory exactly")] = None,
    allow_data_change: Annotated[
        bool, typer.Option("--allow-data-change", help="with --resume: continue even though the names file "
                           "differs from the one the run trained on (its sha256 is in the checkpoint)")
    ] = False,
    *,
    overrides: dict[str, Any],
) -> None:
    """Train a model; writes config.yaml, metrics.jsonl and checkpoint.npz to the run directory.

    Each value comes from: its flag > the --config file > the preset of the chosen d_model > the built-in default.
    """
    console = Console(soft_wrap=True)  # log lines stay whole in logs and pipes

    def note(text: str) -> None:
        console.print(text, highlight=False)

    # backend and data have their own precedence, with an environment variable between flag and config.
    backend, data = overrides.pop("backend"), overrides.pop("data")
    registry = load_registry()
    if resume is not None:
        changeable = [key for key in overrides if SETTINGS[key].on_resume]
        extend_to = overrides.pop("steps")  # --steps with --resume: train on to that many steps
        given = [flags_of(key) for key, v in overrides.items() if v is not None and key not in changeable]
        if config is not None:
            given.insert(0, "--config")
        if given:
            allowed = ", ".join(flag_of(key) for key, setting in SETTINGS.items() if setting.on_resume)
            raise ConfigError(f"--resume continues the saved config; drop {', '.join(given)} "
                              f"(only {allowed} may change, and --steps extends the run)")
        changes = {key: overrides[key] for key in changeable if overrides[key] is not None}
        planned = runs.plan_resume(registry, resume, backend=backend, data=data, allow_data_change=allow_data_change,
                                   extend_to=extend_to, changes=changes, note=note)
        if isinstance(planned, runs.AlreadyFinished):
            note(planned.describe())
            return
        plan = planned
    else:
        if allow_data_change:
            raise ConfigError("--allow-data-change only applies with --resume")
        cfg = load_config(config, overrides)
        plan = runs.plan_fresh(registry, cfg, backend=backend, data=data)
    cfg = plan.cfg
    result = runs.execute(plan, registry, RichReporter(console))
    _summary(result, cfg, console)
    if result.interrupted:
        console.print(f"resume with: eemicrogpt train --resume {plan.run_dir.path}", highlight=False)
        raise typer.Exit(128 + (result.stop_signal or signal.SIGINT))  # the shell's convention: 130 for Ctrl-C


@app.command("sample")
def sample_cmd(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by `eemicrogpt train`")],
    n: Annotated[int | None, typer.Option("-n", "--num", help=f"how many names (default {NAMES_N}) or text "
                                          f"continuations (default {TEXT_N}); 1..{MAX_SAMPLES:,}")] = None,
    temperature: Annotated[
        float | None, typer.Option(help=f"sampling temperature (>= 0; lower is more typical; 0 is greedy; default "
                                   f"{NAMES_TEMPERATURE} for names, {TEXT_TEMPERATURE} for text)")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="sampling seed (default: fresh samples each time)")] = None,
    top_k: Annotated[int | None, typer.Option(help="draw from the k most likely tokens only (1..vocabulary)")] = None,
    top_p: Annotated[float | None, typer.Option(help="draw from the fewest most likely tokens whose "
                                                "probabilities sum to >= p (0 < p <= 1)")] = None,
    prefix: Annotated[str | None, typer.Option(help="names: continue names that start with this text")] = None,
    max_len: Annotated[
        int | None, typer.Option(help="names: longest name in characters (default and upper bound: the context)")
    ] = None,
    unique: Annotated[bool, typer.Option("--unique", help="names: distinct names only (fewer when the model has "
                                         "fewer to give)")] = False,
    prompt: Annotated[str | None, typer.Option(help="text: continue this text (default: a newline if the text has "
                                               "one, else its first character)")] = None,
    prompt_file: Annotated[Path | None, typer.Option(help="text: continue the text of this UTF-8 file")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help=f"text: characters to generate per continuation "
                                                       f"(default {DEFAULT_NEW_TOKENS}; "
                                                       f"1..{MAX_NEW_TOKENS:,})")] = None,
    slide: Annotated[int | None, typer.Option(help="text: past the context, drop this many characters of the "
                                              "window at a time (default: a quarter of the context; 1 crops "
                                              "before every character, as nanoGPT, several times slower)")] = None,
    out: Annotated[Path | None, typer.Option(help="write to this new file (never overwritten)")] = None,
    best: Annotated[bool, typer.Option("--best", help=_BEST_HELP)] = False,
) -> None:
    """Generate names, or continue a prompt, from a trained run (printed as they are drawn)."""
    if n is not None and not 1 <= n <= MAX_SAMPLES:
        raise ConfigError(f"-n must be in 1..{MAX_SAMPLES:,}, got {n:,}")
    if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
        raise ConfigError(f"--temperature must be a finite number >= 0 (0: greedy), got {temperature}")
    if seed is not None and seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {seed}")
    if max_new_tokens is not None and not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise ConfigError(f"--max-new-tokens must be in 1..{MAX_NEW_TOKENS:,}, got {max_new_tokens:,} (a million "
                          "characters already take minutes; more is taken for a mistake)")
    if top_k is not None and top_k < 1:
        raise ConfigError(f"--top-k must be >= 1 (and at most the model's vocabulary), got {top_k}")
    if top_p is not None and not (math.isfinite(top_p) and 0 < top_p <= 1):
        raise ConfigError(f"--top-p must be in (0, 1], got {top_p}")
    if prompt is not None and prompt_file is not None:
        raise ConfigError("give --prompt or --prompt-file, not both")
    target = user_path(out, "--out") if out is not None else None
    if target is not None and (target.exists() or target.is_symlink()):
        raise ConfigError(f"--out {target} already exists; choose a new file (samples never overwrite one)")
    options = SampleOptions(n, temperature, seed, top_k, top_p, prefix, max_len, unique, prompt,
                            user_path(prompt_file, "--prompt-file") if prompt_file is not None else None,
                            max_new_tokens, slide)
    ckpt = load_checkpoint(model_file(run_dir, best))
    pieces = sample_lines(ckpt, options)
    if target is None:
        stream(pieces, sys.stdout)
        return
    names, chars = write_new(pieces, target)
    print(f"wrote {names:,} names" if ckpt.vocab.with_boundary else f"wrote {chars:,} characters", f"to {target}")


@app.command("eval")
def eval_cmd(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by `eemicrogpt train`")],
    data: Annotated[Path, typer.Option(help="the file to evaluate on, in the run's format (a list, or a text)")],
    backend: Annotated[str | None, typer.Option(help="backend name or 'auto' (default: $EEMICROGPT_BACKEND, else "
                                                "the run's)")] = None,
    best: Annotated[bool, typer.Option("--best", help=_BEST_HELP)] = False,
) -> None:
    """Mean loss of a trained run over a whole file: every name of a list, every character of a text."""
    from ..training.evaluation import evaluate_file

    ckpt = load_checkpoint(model_file(run_dir, best))
    unit = "windows" if ckpt.config.data_format == "text" else "names"
    with batch_progress(f"eval ({ckpt.config.batch} {unit} a batch)") as on_batch:
        result = evaluate_file(load_registry(), ckpt, user_path(data, "--data"), backend, on_batch)
    per = "character" if result.unit == "characters" else "token"
    print(f"{data}: loss {result.loss:.4f} nats, {result.bits:.4f} bits per {per} over {result.predictions:,} "
          f"predictions ({result.items:,} {result.unit}; {result.backend})")


@app.command("export")
def export_cmd(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by `eemicrogpt train`")],
    out: Annotated[Path, typer.Option(help="the new file to write (never overwritten)")],
    format: Annotated[str, typer.Option(help="safetensors (tensors by name, shape/config/vocabulary in the "
                                        "metadata), torch (a state dict for eemicrogpt_core.tools.torch_model) or "
                                        "onnx (next-token logits for token prefixes, vocabulary in the metadata)")]
    = "safetensors",
    best: Annotated[bool, typer.Option("--best", help=_BEST_HELP)] = False,
) -> None:
    """Write a run's weights for use elsewhere."""
    from .api import load

    path = load(run_dir, best=best).export(out, format)
    print(f"wrote {path} ({format})")


def backends_report(registry: BackendRegistry) -> dict[str, Any]:
    default = TrainConfig()
    auto = registry.auto_choice(default.model_shape(NAMES_VOCAB), default.batch)
    per_size = {}
    for d in bench.SIZES:
        choice = registry.auto_choice(ModelShape(d, bench.heads_for(d)), default.batch)
        per_size[str(d)] = choice.name if choice else None
    return {
        "backends": [
            {
                "name": e.name,
                "qualified_name": e.qualified_name,  # what --backend takes when two distributions share the name
                "distribution": e.distribution,
                "version": e.version,
                "available": e.available,
                "reason": e.status_reason,
                "score": e.score,
                "precision": e.spec.precision if e.spec else None,
                "description": e.spec.description if e.spec else "",
                "envelope": e.spec.envelope if e.spec else "",
                "also_provided_by": e.also_provided_by,
            }
            for e in registry.entries
        ],
        "auto": auto.name if auto else None,
        "auto_by_d_model": per_size,
        "plugin_failures": [dataclasses.asdict(f) for f in registry.failures],
    }


@app.command("backends")
def backends_cmd(as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False) -> None:
    """List installed backends: availability and why, score, and what `auto` picks here."""
    report = backends_report(load_registry())
    if as_json:
        print(json.dumps(report, indent=2))
        return
    console = _wide_console()
    table = Table("backend", "distribution", "version", "precision", "available", "score", "shapes", "reason")
    for b in report["backends"]:
        table.add_row(b["name"], b["distribution"], b["version"], b["precision"] or "-",
                      "yes" if b["available"] else "no", str(b["score"]), b["envelope"] or "-", b["reason"])
    console.print(table)
    sizes = ", ".join(f"d{d}: {name or 'none'}" for d, name in report["auto_by_d_model"].items())
    if report["auto"]:
        default = TrainConfig()
        console.print(f"auto picks: {report['auto']} (default config: d{default.d_model}, batch {default.batch}, "
                      f"fp32; reduced precision only with --precision or by name); by size: {sizes}",
                      highlight=False)
    elif not report["backends"]:
        console.print("no backend installed: pip install ./backends/numpy_ref (portable) or ./backends/x86")
    else:
        console.print("auto picks: nothing (no available backend can run the default config)")
    for f in report["plugin_failures"]:
        console.print(f"broken plugin {f['plugin']} ({f['distribution']}): {f['error']}", highlight=False)


def _wide_console(stderr: bool = False) -> Console:
    """Tables stay readable when piped (rich would otherwise assume 80 columns)."""
    console = Console(stderr=stderr)
    return console if console.is_terminal else Console(stderr=stderr, width=160)


def _pct(value: float | None) -> str:
    return f"{value:.1f}%" if value is not None else "-"


def _speed_table(title: str, rows: list[bench.BenchRow]) -> Table:
    if rows:
        r0 = rows[0]
        title += f" ({r0.n_layers} layer{'s' if r0.n_layers > 1 else ''}, vocab {r0.vocab}, context {r0.context})"
    table = Table("backend", "threads", "precision", "d_model", "heads", "batch", "us/step", "us/sample", "steps/s",
                  "GFLOP/s", "% peak", "live pos", "us/live pos", title=title)
    for r in rows:
        if r.error is not None:
            table.add_row(r.backend, str(r.threads), r.precision, str(r.d_model), str(r.n_heads), str(r.batch),
                          f"failed: {r.error}")
            continue
        table.add_row(r.backend, str(r.threads), r.precision, str(r.d_model), str(r.n_heads), str(r.batch),
                      f"{r.us_per_step:,.1f}",
                      f"{r.us_per_sample:,.2f}", f"{r.steps_per_s:,.0f}", f"{r.gflops:.2f}", _pct(r.pct_peak),
                      f"{r.live_positions:.0f}", f"{r.us_per_live_position:.2f}")
    return table


@app.command("bench")
def bench_cmd(
    backend: Annotated[str | None, typer.Option(help="only this backend (default: every available one)")] = None,
    d_model: Annotated[list[int] | None, typer.Option(help="sizes to run (repeatable; default 16 32 64 128)")] = None,
    batch_scaling: Annotated[bool, typer.Option("--batch-scaling", help="batch 1/16/64/256 on the best")] = False,
    loss_at: Annotated[
        float | None, typer.Option(help="also: best loss within this many seconds of training per size "
                                   "(EEmicroGPT's bpc@1s table; on the last --threads value)")
    ] = None,
    peak_gflops_: Annotated[
        float | None, typer.Option("--peak-gflops", help="one core's FP32 peak to compare against (default: "
                                   "measured by the plugin of the best backend here)")
    ] = None,
    repeats: Annotated[int, typer.Option(help="timed repeats per cell (median reported)")] = 5,
    seconds: Annotated[float, typer.Option(help="timed seconds per cell")] = 0.3,
    data: Annotated[str | None, typer.Option(help=_DATA_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    threads: Annotated[list[int] | None, typer.Option(
        help="threads per step, repeatable to measure several counts side by side (default: the physical "
             "cores available)")] = None,
    precision: Annotated[str | None, typer.Option(help="only backends computing in this precision: fp32, bf16 or "
                                                  "fp16 (default: every available one)")] = None,
    n_layers: Annotated[int, typer.Option(help="layers of the benchmarked model")] = 1,
    vocab: Annotated[int | None, typer.Option(help="vocabulary size (default: the names file's 27; another "
                                              "size or --context runs on synthetic names)")] = None,
    context: Annotated[int | None, typer.Option(help="predictions per name (default 16)")] = None,
    batch: Annotated[list[int] | None, typer.Option(
        help="batches of the --d-model table (repeatable; default 16; the seed's table is 16 and 128)")] = None,
    shape: Annotated[list[str] | None, typer.Option(
        help=f"instead of --d-model: {', '.join(bench.NAMED_SHAPES)} (nanoGPT's CPU recipe and full "
             "shakespeare_char model) or d_model,heads,layers,vocab,context,batch, on random full-length "
             "windows as text trains (repeatable)")] = None,
) -> None:
    """Median us/step, us/sample, steps/s, GFLOP/s and % of FP32 peak (of the cores used) per backend and size."""
    sizes = tuple(d_model) if d_model else bench.SIZES
    form = bench.Form(n_layers, vocab or NAMES_VOCAB, context or DEFAULT_CONTEXT)
    for d in sizes:
        if d > MAX_D_MODEL:
            raise ConfigError(f"--d-model {d}: must be <= {MAX_D_MODEL}")
        try:
            form.shape(d)
        except ValueError as e:
            raise ConfigError(f"--d-model {d} with --n-layers/--vocab/--context: {e}") from None
    batches = list(dict.fromkeys(batch)) if batch else [16]
    for b in batches:
        if not 1 <= b <= MAX_CONFIG_BATCH:
            raise ConfigError(f"--batch must be in 1..{MAX_CONFIG_BATCH}, got {b}")
    cases: list[tuple[str, ModelShape, int]] = []
    for spec in shape or ():
        if d_model or batch or batch_scaling or loss_at is not None or n_layers != 1 or vocab or context:
            raise ConfigError("--shape: names the whole shape; it cannot be combined with --d-model, --batch, "
                              "--n-layers, --vocab, --context, --batch-scaling or --loss-at")
        try:
            cases.append(bench.parse_shape(spec))
        except ValueError as e:
            raise ConfigError(f"--{e}") from None
        if not 1 <= cases[-1][2] <= MAX_CONFIG_BATCH:
            raise ConfigError(f"--shape {spec!r}: batch must be in 1..{MAX_CONFIG_BATCH}, got {cases[-1][2]}")
    if not 1 <= repeats <= MAX_BENCH_REPEATS:
        raise ConfigError(f"--repeats must be in 1..{MAX_BENCH_REPEATS}, got {repeats}")
    for flag, value, bound in (("--seconds", seconds, MAX_BENCH_SECONDS), ("--loss-at", loss_at, MAX_BENCH_SECONDS),
                               ("--peak-gflops", peak_gflops_, math.inf)):
        if value is not None and not (math.isfinite(value) and 0 < value <= bound):
            raise ConfigError(f"{flag} must be a finite number in (0, {bound:g}], got {value}")
    for count in threads or ():
        if count < 1:
            raise ConfigError(f"--threads must be >= 1, got {count}")
    thread_counts: list[int | None] = list(dict.fromkeys(threads)) if threads else [None]
    if precision is not None and precision not in PRECISIONS:
        raise ConfigError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    registry = load_registry()
    entries = bench.pick_backends(registry, backend, precision)
    # Names are read only when a cell trains on them: --shape and synthetic forms need no data file.
    needs_names = not cases and (form.uses_names or loss_at is not None)
    data_path = resolve_data_path(data, None) if needs_names else None
    if data_path is not None:
        base = TrainConfig(data=str(data_path))
        names = read_names(data_path)
        vocab_table = Vocabulary.from_names(names.names)
        parts = split(encode(names.names, vocab_table, base.context)[0], base.val_fraction, base.seed)
    train_set = parts.train if form.uses_names and data_path is not None else bench.synthetic_data(form)
    # Each backend is compared with the peak of the precision it computes in; the user's FP32 figure wins.
    peaks: dict[str, float] = {}
    peak_sources: dict[str, str] = {}
    for prec in dict.fromkeys(bench.precision_of(e) for e in entries):
        if prec == FP32 and peak_gflops_:
            peaks[prec], peak_sources[prec] = peak_gflops_, "--peak-gflops"
            continue
        measured = peak_gflops(registry, precision=prec)
        if measured is not None:
            peaks[prec], peak_sources[prec] = measured.gflops, f"measured by {measured.source}"
    console = _wide_console(stderr=as_json)
    timing: dict[str, Any] = {"peaks": peaks, "repeats": repeats, "target_s": seconds}
    shapes = [form.shape(d) for d in sizes]
    if cases:
        console.print(f"timing {', '.join(e.name for e in entries)} at {', '.join(c[0] for c in cases)} ...")
        rows, notes = [], []
        for _, case_shape, case_batch in cases:
            more_rows, more_notes = bench.measure(
                bench.speed_cells(entries, [case_shape], [case_batch], threads=thread_counts),
                bench.full_windows(case_shape), **timing)
            rows += more_rows
            notes += more_notes
    else:
        console.print(f"timing {', '.join(e.name for e in entries)} at d_model {', '.join(map(str, sizes))} ...")
        rows, notes = bench.measure(bench.speed_cells(entries, shapes, batches, threads=thread_counts), train_set,
                                    **timing)
    bench.require_measured(rows, notes)
    scaling: list[bench.BenchRow] = []
    losses: list[bench.LossRow] = []
    best = bench.best_backend(registry, backend, sizes, precision) if (batch_scaling or loss_at) else None
    if batch_scaling and best is not None:
        console.print(f"batch scaling on {best.name} ...")
        scaling, more = bench.measure(bench.scaling_cells(best, shapes, threads=thread_counts), train_set,
                                      **timing)
        notes += more
    if loss_at is not None and best is not None:
        console.print(f"loss within {loss_at:g} s on {best.name} ...")
        assert data_path is not None  # read above for --loss-at
        prepared = PreparedData(parts.train, parts.validation, 0, 0, vocab_table)
        losses = bench.loss_at(registry, best, sizes, prepared, str(data_path), loss_at, thread_counts[-1])
    if as_json:
        payload = bench.as_json(speed=rows, batch_scaling=scaling, loss_at=losses, notes=notes,
                                peak_gflops=peaks, peak_source=peak_sources, flops_formula=bench.__doc__)
        print(json.dumps(payload, indent=2))
        _exit_if_failed([*rows, *scaling, *losses], console)
        return
    if cases:
        for label, case_shape, case_batch in cases:
            console.print(_speed_table(f"us/step, {label} (full-length windows)",
                                       [r for r in rows if r.shape == case_shape and r.batch == case_batch]))
    else:
        console.print(_speed_table(f"us/step at batch {', '.join(map(str, batches))}", rows))
    if scaling:
        console.print(_speed_table(f"batch scaling ({scaling[0].backend})", scaling))
    if losses:
        table = Table("backend", "d_model", "lr", "steps", "us/step", "train loss", "val loss",
                      title=f"loss within {loss_at:g} s (LR schedule spans the steps that fit)")
        for r in losses:
            if r.error is not None:
                table.add_row(r.backend, str(r.d_model), f"{r.lr:g}", f"failed: {r.error}")
                continue
            val = f"{r.val_loss:.4f}" if r.val_loss is not None else "-"
            table.add_row(r.backend, str(r.d_model), f"{r.lr:g}", f"{r.steps:,}", f"{r.us_per_step:,.1f}",
                          f"{r.train_loss:.4f}", val)
        console.print(table)
    for prec in dict.fromkeys(r.precision for r in rows):
        if prec in peaks:
            console.print(f"{prec} peak: {peaks[prec]:.1f} GFLOP/s per core ({peak_sources[prec]}); % peak of a "
                          f"{prec} backend is of threads x this", highlight=False)
        else:
            hint = "; pass --peak-gflops" if prec == FP32 else ""
            console.print(f"{prec} peak: unknown (no plugin measures it here{hint}): no % of peak for {prec} rows",
                          highlight=False)
    for note in notes:
        console.print(note, highlight=False)
    _exit_if_failed([*rows, *scaling, *losses], console)


def _exit_if_failed(rows: list[bench.BenchRow | bench.LossRow], console: Console) -> None:
    """Every cell ran; a backend that failed on some makes the exit status 1 (its rows say why)."""
    failed = sorted({r.backend for r in rows if r.error is not None})
    if failed:
        console.print(f"failed: {', '.join(failed)} (see the rows above)", highlight=False)
        raise typer.Exit(1)


@app.command("sweep")
def sweep_cmd(
    spec: Annotated[str, typer.Argument(help="sweep spec: a YAML file (base, grid, random, seeds, steps/time_budget) "
                                        "or a shipped spec's name (time_to_2; `eemicrogpt configs` lists them)")],
    out: Annotated[Path | None, typer.Option(help="sweep directory (default sweeps/<spec name>)")] = None,
    executor: Annotated[str, typer.Option(help="local (worker processes, one per physical core) or ray")] = "local",
    address: Annotated[str | None, typer.Option(help="Ray cluster address (default: $RAY_ADDRESS or auto)")] = None,
    workers: Annotated[int | None, typer.Option(help="local workers (default: one per physical core)")] = None,
    backend: Annotated[str | None, typer.Option(help=_BACKEND_HELP)] = None,
    data: Annotated[str | None, typer.Option(help=_DATA_HELP)] = None,
) -> None:
    """Train many runs (grid, random draws, seeds); re-running skips finished runs and resumes interrupted ones.

    Exit status: 0 all runs finished, 1 some failed (recorded with their error), 2 bad spec, 130 Ctrl-C (143
    SIGTERM, 129 SIGHUP: each stops the workers' runs at a checkpoint and records them, as Ctrl-C does)."""
    from ..sweep.command import sweep_command

    outcome = sweep_command(spec, out=out, executor=executor, address=address, workers=workers, backend=backend,
                            data=data, console=_wide_console())
    if outcome.interrupted:  # the shell convention, as train uses: 130 for Ctrl-C, 143 SIGTERM, 129 SIGHUP
        raise typer.Exit(128 + (outcome.stop_signal or signal.SIGINT))
    if outcome.failed:
        raise typer.Exit(1)  # the runs' one-line errors are in the table and in results.jsonl


@app.command("configs")
def configs_cmd() -> None:
    """List the configs and sweep specs shipped with eemicrogpt, usable by name (--config d16, sweep time_to_2)."""
    for kind, usage in (("config", "eemicrogpt train --config NAME"), ("sweep", "eemicrogpt sweep NAME")):
        files = shipped(kind)
        print(f"{kind}s ({usage}):")
        width = max(map(len, files), default=0)
        for name, path in files.items():
            print(f"  {name:<{width}}  {description(path)}")


@app.command("plot")
def plot_cmd(
    paths: Annotated[list[Path], typer.Argument(help="run directories, sweep directories or `bench --json` files")],
    out: Annotated[Path, typer.Option(help="directory for the figures")] = Path("plots"),
    fmt: Annotated[str, typer.Option("--format", help="png or svg")] = "png",
) -> None:
    """Charts: loss curves of runs; Pareto, loss vs lr and heatmap of sweeps; speed and batch scaling of bench."""
    from ..tools.plot import plot_command

    for path in plot_command(paths, out, fmt):
        print(path)
