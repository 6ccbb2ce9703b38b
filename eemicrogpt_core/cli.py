"""The `eemicrogpt` command: train, sample, backends, bench.

User errors (EemicrogptError) and bad usage print one line on stderr and exit 2; no traceback.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from . import __version__, bench
from .checkpoint import Checkpoint, load_checkpoint
from .config import TrainConfig, build_config, load_config, resolve_backend
from .data import encode, read_names, split
from .datafile import resolve_data_path
from .errors import ConfigError, EemicrogptError
from .model import ModelShape
from .progress import RichReporter
from .registry import BackendRegistry, load_registry, peak_gflops
from .rundir import RunDir
from .sampling import generate
from .trainer import PreparedData, TrainResult, prepare_data, train

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


def _fail(message: str, code: int = EXIT_USER_ERROR) -> int:
    one_line = " ".join(message.split())
    print(f"eemicrogpt: error: {one_line}", file=sys.stderr)
    return code


class OneLineErrors(TyperGroup):
    """Turns user errors and usage errors into a single stderr line instead of a traceback or a panel."""

    def main(  # type: ignore[override]
        self,
        args: list[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) else 0
        except EemicrogptError as e:
            code = _fail(str(e))
        except typer.Abort:
            code = _fail("aborted", 1)
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
                code = _fail(f"{where}: {e.format_message()} (see {where} --help)", e.exit_code)
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

_THREADS_HELP = "threads per step (default: the physical cores available; same threads => same losses)"
_BACKEND_HELP = "backend name or 'auto' (precedence: this flag > $EEMICROGPT_BACKEND > config > auto)"
_DATA_HELP = "names file (precedence: this flag > $EEMICROGPT_DATA > config > cached makemore names.txt)"


def _summary(result: TrainResult, cfg: TrainConfig, console: Console) -> None:
    val = f"{result.val_loss:.4f}" if result.val_loss is not None else "-"
    step = int(result.state.step)
    console.print(
        f"done: step {step:,}/{result.total_steps:,} on {result.backend}; final train loss {result.train_loss:.4f} "
        f"(mean of last 100), val loss {val}; {result.us_per_step:.1f} us/step, {result.steps_per_s:,.0f} steps/s",
        highlight=False,
    )
    names = generate(result.state.params, cfg.shape, n=10, temperature=0.5, seed=cfg.seed)
    console.print("samples: " + ", ".join(names), highlight=False)
    if result.run_dir is not None:
        console.print(f"run directory: {result.run_dir}", highlight=False)


def _fresh_setup(
    registry: BackendRegistry, config: Path | None, overrides: dict[str, Any], backend: str | None, data: str | None
) -> tuple[TrainConfig, RunDir, PreparedData]:
    """Resolve config, backend and data, and check all of them before a run directory is created."""
    cfg = load_config(config, overrides)
    cfg = dataclasses.replace(cfg, backend=resolve_backend(backend, cfg.backend))
    registry.select(cfg.backend, cfg.shape, cfg.batch, cfg.dtype)  # before any download: fail fast
    cfg = dataclasses.replace(cfg, data=str(resolve_data_path(data, cfg.data)))
    prepared = prepare_data(cfg)
    run = RunDir.create(cfg.out, cfg)
    return dataclasses.replace(cfg, out=str(run.path)), run, prepared


def _resume_setup(
    registry: BackendRegistry, resume: Path, backend: str | None, data: str | None, console: Console
) -> tuple[TrainConfig, RunDir, Checkpoint, None] | None:
    """The saved run with only backend and data overridable; None when it has already finished."""
    run = RunDir.existing(resume)
    ckpt = load_checkpoint(run.checkpoint_path)
    cfg = dataclasses.replace(
        ckpt.config, backend=resolve_backend(backend, ckpt.config.backend), data=data or ckpt.config.data,
        out=str(run.path),
    )
    if ckpt.state.step >= ckpt.total_steps:
        console.print(f"{run.path} already finished ({ckpt.total_steps:,} steps); nothing to resume")
        return None
    chosen = registry.select(cfg.backend, cfg.shape, cfg.batch, cfg.dtype).name
    if ckpt.backend and chosen != ckpt.backend:
        console.print(f"note: this run was trained on {ckpt.backend} and continues on {chosen}; the "
                      f"losses will not match an uninterrupted {ckpt.backend} run bit for bit", highlight=False)
    return cfg, run, ckpt, None


@app.command("train")
def train_cmd(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="YAML config (default: built in, equal to configs/d64.yaml)")
    ] = None,
    backend: Annotated[str | None, typer.Option(help=_BACKEND_HELP)] = None,
    d_model: Annotated[int | None, typer.Option(help="model width")] = None,
    n_heads: Annotated[int | None, typer.Option(help="attention heads (must divide d_model)")] = None,
    batch: Annotated[int | None, typer.Option(help="names per step")] = None,
    steps: Annotated[int | None, typer.Option(help="training steps (the LR decays to zero over them)")] = None,
    time_budget: Annotated[
        float | None, typer.Option(help="seconds of training (measured by a short warm-up first); the steps that "
                                   "fit replace --steps")
    ] = None,
    lr: Annotated[float | None, typer.Option(help="initial learning rate")] = None,
    seed: Annotated[int | None, typer.Option(help="seed of init, split and batches")] = None,
    data: Annotated[str | None, typer.Option(help=_DATA_HELP)] = None,
    drop_invalid: Annotated[
        bool, typer.Option("--drop-invalid", help="skip names with characters outside a-z (counted)")
    ] = False,
    out: Annotated[str | None, typer.Option(help="run directory (default runs/<time>-d<d_model>)")] = None,
    log_every: Annotated[int | None, typer.Option(help="steps between log lines, val loss and checkpoints")] = None,
    resume: Annotated[Path | None, typer.Option(help="continue the run in this directory exactly")] = None,
    threads: Annotated[int | None, typer.Option(help=_THREADS_HELP)] = None,
) -> None:
    """Train a model; writes config.yaml, metrics.jsonl and checkpoint.npz to the run directory."""
    console = Console(soft_wrap=True)  # log lines stay whole in logs and pipes
    overrides = {
        "d_model": d_model, "n_heads": n_heads, "batch": batch, "steps": steps, "time_budget": time_budget,
        "lr": lr, "seed": seed, "out": out, "log_every": log_every, "drop_invalid": drop_invalid or None,
        "threads": threads,
    }
    registry = load_registry()
    if resume is not None:
        given = [f"--{k.replace('_', '-')}" for k, v in overrides.items() if v is not None and k != "threads"]
        if config is not None:
            given.insert(0, "--config")
        if given:
            raise ConfigError(f"--resume continues the saved config; drop {', '.join(given)} "
                              "(only --backend, --data and --threads may change)")
        setup = _resume_setup(registry, resume, backend, data, console)
        if setup is None:
            return
        cfg, run, ckpt, prepared = setup
        if threads is not None:
            cfg = build_config([("command line", {"threads": threads})], cfg)  # checked like any override
    else:
        cfg, run, prepared = _fresh_setup(registry, config, overrides, backend, data)
        ckpt = None
    result = train(cfg, registry, run_dir=run, resume=ckpt, reporter=RichReporter(console), data=prepared)
    _summary(result, cfg, console)
    if result.interrupted:
        console.print(f"resume with: eemicrogpt train --resume {run.path}", highlight=False)
        raise typer.Exit(EXIT_INTERRUPTED)


@app.command("sample")
def sample_cmd(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by `eemicrogpt train`")],
    n: Annotated[int, typer.Option("-n", "--num", help="how many names")] = 20,
    temperature: Annotated[float, typer.Option(help="sampling temperature (> 0; lower is more typical)")] = 0.5,
    seed: Annotated[int, typer.Option(help="sampling seed")] = 0,
) -> None:
    """Generate names from a trained run."""
    ckpt = load_checkpoint(RunDir.existing(run_dir).checkpoint_path)
    for name in generate(ckpt.state.params, ckpt.config.shape, n=n, temperature=temperature, seed=seed):
        print(name)


def backends_report(registry: BackendRegistry) -> dict[str, Any]:
    default = TrainConfig()
    auto = registry.auto_choice(default.shape, default.batch)
    per_size = {}
    for d in bench.SIZES:
        choice = registry.auto_choice(ModelShape(d, bench.heads_for(d)), default.batch)
        per_size[str(d)] = choice.name if choice else None
    return {
        "backends": [
            {
                "name": e.name,
                "distribution": e.distribution,
                "version": e.version,
                "available": e.available,
                "reason": e.status_reason,
                "score": e.score,
                "description": e.spec.description if e.spec else "",
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
    table = Table("backend", "distribution", "version", "available", "score", "reason")
    for b in report["backends"]:
        table.add_row(b["name"], b["distribution"], b["version"], "yes" if b["available"] else "no",
                      str(b["score"]), b["reason"])
    console.print(table)
    sizes = ", ".join(f"d{d}: {name or 'none'}" for d, name in report["auto_by_d_model"].items())
    if report["auto"]:
        default = TrainConfig()
        console.print(f"auto picks: {report['auto']} (default config: d{default.d_model}, batch {default.batch}); "
                      f"by size: {sizes}", highlight=False)
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
    table = Table("backend", "threads", "precision", "d_model", "heads", "batch", "us/step", "us/sample", "steps/s",
                  "GFLOP/s", "% peak", "live pos", title=title)
    for r in rows:
        table.add_row(r.backend, str(r.threads), r.precision, str(r.d_model), str(r.n_heads), str(r.batch),
                      f"{r.us_per_step:,.1f}",
                      f"{r.us_per_sample:,.2f}", f"{r.steps_per_s:,.0f}", f"{r.gflops:.2f}", _pct(r.pct_peak),
                      f"{r.live_positions:.0f}")
    return table


@app.command("bench")
def bench_cmd(
    backend: Annotated[str | None, typer.Option(help="only this backend (default: every available one)")] = None,
    d_model: Annotated[list[int] | None, typer.Option(help="sizes to run (repeatable; default 16 32 64 128)")] = None,
    batch_scaling: Annotated[bool, typer.Option("--batch-scaling", help="batch 1/16/64/256 on the best")] = False,
    loss_at: Annotated[
        float | None, typer.Option(help="also: best loss within this many seconds per size (the seed's bpc@1s)")
    ] = None,
    peak_gflops_: Annotated[
        float | None, typer.Option("--peak-gflops", help="FP32 peak to compare against if no plugin measures it")
    ] = None,
    repeats: Annotated[int, typer.Option(help="timed repeats per cell (median reported)")] = 5,
    seconds: Annotated[float, typer.Option(help="timed seconds per cell")] = 0.3,
    data: Annotated[str | None, typer.Option(help=_DATA_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    threads: Annotated[int | None, typer.Option(help=_THREADS_HELP)] = None,
) -> None:
    """Median us/step, us/sample, steps/s, GFLOP/s and % of FP32 peak per backend and size (batch 16)."""
    sizes = tuple(d_model) if d_model else bench.SIZES
    for d in sizes:
        try:
            ModelShape(d, bench.heads_for(d))
        except ValueError as e:
            raise ConfigError(f"--d-model {d}: {e}") from None
    if repeats < 1 or seconds <= 0:
        raise ConfigError("--repeats must be >= 1 and --seconds > 0")
    if threads is not None and threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {threads}")
    if loss_at is not None and loss_at <= 0:
        raise ConfigError(f"--loss-at must be a positive number of seconds, got {loss_at}")
    registry = load_registry()
    entries = bench.pick_backends(registry, backend)
    data_path = resolve_data_path(data, None)
    base = TrainConfig(data=str(data_path))
    names = read_names(data_path)
    train_set, val_set = split(encode(names.names)[0], base.val_fraction, base.seed)
    measured = peak_gflops(registry)
    peak = measured or peak_gflops_
    peak_source = "measured by a plugin" if measured else ("--peak-gflops" if peak else None)
    console = _wide_console(stderr=as_json)
    console.print(f"timing {', '.join(e.name for e in entries)} at d_model {', '.join(map(str, sizes))} ...")
    timing = {"peak": peak, "repeats": repeats, "target_s": seconds, "threads": threads}
    rows, notes = bench.measure(bench.speed_cells(entries, sizes), train_set, **timing)
    scaling: list[bench.BenchRow] = []
    losses: list[bench.LossRow] = []
    best = bench.best_backend(registry, backend, sizes) if (batch_scaling or loss_at) else None
    if batch_scaling and best is not None:
        console.print(f"batch scaling on {best.name} ...")
        scaling, more = bench.measure(bench.scaling_cells(best, sizes), train_set, **timing)
        notes += more
    if loss_at is not None and best is not None:
        console.print(f"loss within {loss_at:g} s on {best.name} ...")
        prepared = PreparedData(train_set, val_set, 0, 0)
        losses = bench.loss_at(registry, best, sizes, prepared, str(data_path), loss_at, threads)
    if as_json:
        payload = bench.as_json(speed=rows, batch_scaling=scaling, loss_at=losses, notes=notes,
                                peak_gflops=peak, peak_source=peak_source, flops_formula=bench.__doc__)
        print(json.dumps(payload, indent=2))
        return
    console.print(_speed_table("us/step at batch 16", rows))
    if scaling:
        console.print(_speed_table(f"batch scaling ({scaling[0].backend})", scaling))
    if losses:
        table = Table("backend", "d_model", "lr", "steps", "us/step", "train loss", "val loss",
                      title=f"loss within {loss_at:g} s (LR schedule spans the steps that fit)")
        for r in losses:
            val = f"{r.val_loss:.4f}" if r.val_loss is not None else "-"
            table.add_row(r.backend, str(r.d_model), f"{r.lr:g}", f"{r.steps:,}", f"{r.us_per_step:,.1f}",
                          f"{r.train_loss:.4f}", val)
        console.print(table)
    console.print(f"FP32 peak: {peak:.1f} GFLOP/s ({peak_source})" if peak else
                  "FP32 peak: unknown (no plugin measures it here; pass --peak-gflops to get % of peak)")
    for note in notes:
        console.print(note, highlight=False)
