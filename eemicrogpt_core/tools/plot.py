"""`eemicrogpt plot`: the charts behind the seed's findings, from run directories, sweep directories and
`eemicrogpt bench --json` files.

    run directories      loss_curves: train and val loss against step and against wall-clock seconds, overlaid
    a sweep directory    <name>_pareto: val loss against training time, one colour and frontier per d_model
                         <name>_loss_vs_lr: val loss against learning rate, one line per d_model
                         <name>_heatmap: mean val loss over the two grid keys (when the grid has exactly two)
                         <name>_curves: loss curves of the best runs
                         <name>_time_to_target: training seconds to the target loss per run (runs with a
                         target_loss), fastest first; runs that did not reach it marked as such
    a bench --json file  <name>_speed: us/step per backend and size; <name>_batch_scaling: us/sample per batch

Figures are built as matplotlib Figure objects (no pyplot state, no display needed) and saved as PNG or SVG.
matplotlib is an optional extra: pip install 'eemicrogpt[plot]'.
"""

from __future__ import annotations

import io
import json
import os
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from ..base.atomic import atomic_create_bytes, atomic_write_bytes
from ..base.errors import ConfigError, EemicrogptError, StorageError, describe_os_error
from ..base.ownership import made_by_eemicrogpt, mark_directory
from ..base.paths import resolved_dir, user_path
from ..sweep.driver import RUNS_DIR, SPEC_NAME
from ..sweep.results import JSONL_NAME, finite, has_target, reached, read_results
from ..sweep.runner import DONE
from ..training.config import KEYS
from ..training.rundir import CONFIG_NAME, METRICS_NAME, RunDir

FORMATS = ("png", "svg")
BEST_CURVES = 6  # loss curves drawn for a sweep: its best runs (by time to target, else by val loss)
ROW_INCHES = 0.22  # height of one run's row in the time-to-target chart
DPI = 110
VAL_LOSS = "validation loss (nats per character)"


def _figure(width: float = 7.0, height: float = 4.5) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise EemicrogptError("eemicrogpt plot needs matplotlib, an optional extra: pip install 'eemicrogpt[plot]' "
                              "(or pip install matplotlib)") from None
    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _plain_log(axis: Any, ticks: list[float] | None = None) -> None:
    """A log axis labelled 0.5, 1, 2, 5 (or at the given values) instead of 5x10^-1."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(FixedLocator(ticks) if ticks else LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


MIN_TICK_RATIO = 1.25  # log-axis ticks closer than this (0.1 decade) would print over each other


def _spread(ticks: list[float], min_ratio: float = MIN_TICK_RATIO) -> list[float]:
    """Sorted positive ticks without those too close to the previous one kept (0.002078 beside 0.002198)."""
    kept: list[float] = []
    for tick in sorted(ticks):
        if not kept or tick >= kept[-1] * min_ratio:
            kept.append(tick)
    return kept


def averaged_keys(rows: list[dict[str, Any]], fixed: tuple[str, ...]) -> list[str]:
    """The config keys that differ between runs sharing the `fixed` keys' values: what a mean per point
    averages over (a swept n_heads, the seeds)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[tuple(r.get(k) for k in fixed)].append(r)
    return [k for k in KEYS if k not in fixed and k not in ("out", "data")
            and any(len({repr(r.get(k)) for r in group}) > 1 for group in groups.values())]


def _label(ax: Any, xlabel: str, ylabel: str, title: str) -> None:
    """Axis labels (with units), title, grid and legend: every chart gets all of them."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")


# ---- runs -------------------------------------------------------------------------------------------------


def run_label(run: RunDir) -> str:
    return run.path.name


CURVE_KEYS = ("step", "train_loss", "val_loss", "elapsed_s")  # what a loss curve reads from each record


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def curve_problem(record: dict[str, Any]) -> str | None:
    """Why a metrics record cannot be drawn (a key missing or not a number), or None."""
    for key in CURVE_KEYS:
        if key not in record:
            return f"it has no {key}"
        if not _number(record[key]):
            return f"{key} is {record[key]!r}, not a number"
    return None


def run_records(path: Path) -> list[dict[str, Any]]:
    """A run directory's metrics records, checked for plotting. A line that is not JSON is skipped (a save cut
    short by a full disk leaves one, see RunDir.read_metrics); a record that cannot be drawn is an error naming
    its line, and a log with lines but no records says it is not one eemicrogpt wrote."""
    run = RunDir(path)
    metrics = run.metrics_path
    try:
        text = run.metrics_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: the run has logged no metrics yet") from None
    records, lines = [], 0
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        lines += 1
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        problem = curve_problem(record)
        if problem is not None:
            raise ConfigError(f"{metrics}:{lineno}: a metrics record that cannot be plotted: {problem}")
        records.append(record)
    if not records:
        raise ConfigError(f"{metrics}: none of its {lines} lines is a metrics record; it is not a log that "
                          "eemicrogpt wrote" if lines else f"{path}: the run has logged no metrics yet")
    return records


def loss_curves(runs: dict[str, list[dict[str, Any]]], title: str = "Loss curves") -> Any:
    """Two panels (vs step, vs wall seconds); per run one colour, train solid and val dashed."""
    fig = _figure(11, 4.5)
    by_step, by_time = fig.subplots(1, 2, sharey=True)
    for i, (label, records) in enumerate(runs.items()):
        colour = f"C{i % 10}"
        steps = [r["step"] for r in records]
        seconds = [r["elapsed_s"] for r in records]
        for ax, xs in ((by_step, steps), (by_time, seconds)):
            ax.plot(xs, [r["train_loss"] for r in records], color=colour, label=f"{label} train")
            ax.plot(xs, [r["val_loss"] for r in records], color=colour, linestyle="--", label=f"{label} val")
    by_step.set_xlabel("step")
    by_time.set_xlabel("wall-clock time (s)")
    by_step.set_ylabel("loss (nats per character)")
    for ax, what in ((by_step, "step"), (by_time, "wall-clock time")):
        ax.set_title(f"{title} vs {what}")
        ax.grid(alpha=0.3)
    by_time.legend(fontsize="small", loc="upper right")
    return fig


# ---- sweeps -----------------------------------------------------------------------------------------------


def _done(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("status") == DONE and finite(r.get("val_loss")) and finite(r.get("train_s"))
            and finite(r.get("lr")) and isinstance(r.get("d_model"), int)]


def contended(row: dict[str, Any]) -> bool:
    """A time-budget run that found the machine busy (sweep results' `contended`): its timing is suspect."""
    return row.get("contended") in (True, "True", "true", 1, "1")


CONTENDED_LABEL = "contended run (machine busy: its time is not trustworthy)"


def _ring_contended(ax: Any, points: list[tuple[float, float]]) -> None:
    """A hollow black ring around each contended run's point, one legend entry for all."""
    if points:
        ax.scatter(*zip(*points, strict=True), s=90, facecolors="none", edgecolors="black", linewidths=1.2,
                   label=CONTENDED_LABEL)


def _by_size(rows: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    groups: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[int(r["d_model"])].append(r)
    return dict(sorted(groups.items()))


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points (time, loss) no other point beats on both: sorted by time, each lower than all before."""
    front: list[tuple[float, float]] = []
    for t, loss in sorted(points):
        if not front or loss < front[-1][1]:
            front.append((t, loss))
    return front


def pareto(rows: list[dict[str, Any]], name: str) -> Any:
    fig = _figure()
    ax = fig.subplots()
    for i, (d, group) in enumerate(_by_size(_done(rows)).items()):
        colour = f"C{i % 10}"
        points = [(float(r["train_s"]), float(r["val_loss"])) for r in group]
        ax.scatter(*zip(*points, strict=True), color=colour, alpha=0.45, s=18, label=f"d_model {d} runs")
        front = pareto_front(points)
        ax.plot(*zip(*front, strict=True), color=colour, marker="o", drawstyle="steps-post",
                label=f"d_model {d} frontier")
    _ring_contended(ax, [(float(r["train_s"]), float(r["val_loss"])) for r in _done(rows) if contended(r)])
    ax.set_xscale("log")
    _plain_log(ax.xaxis)
    _label(ax, "training time (s, log scale)", VAL_LOSS,
           f"{name}: val loss vs training time (Pareto frontier per d_model)")
    return fig


def loss_vs_lr(rows: list[dict[str, Any]], name: str) -> Any:
    """Every run as a point; a line through the mean val loss per learning rate, one per d_model."""
    fig = _figure()
    ax = fig.subplots()
    all_lrs: set[float] = set()
    for i, (d, group) in enumerate(_by_size(_done(rows)).items()):
        colour = f"C{i % 10}"
        all_lrs.update(float(r["lr"]) for r in group)
        ax.scatter([r["lr"] for r in group], [r["val_loss"] for r in group], color=colour, alpha=0.45, s=18)
        means: dict[float, list[float]] = defaultdict(list)
        for r in group:
            means[float(r["lr"])].append(float(r["val_loss"]))
        lrs = sorted(means)
        ax.plot(lrs, [sum(means[x]) / len(means[x]) for x in lrs], color=colour, marker="o", label=f"d_model {d}")
    _ring_contended(ax, [(float(r["lr"]), float(r["val_loss"])) for r in _done(rows) if contended(r)])
    ax.set_xscale("log")
    ticks = _spread(list(all_lrs))
    _plain_log(ax.xaxis, ticks if len(ticks) <= 8 else None)
    over = averaged_keys(_done(rows), ("d_model", "lr"))
    line = f"line: mean over {', '.join(over)}" if over else "line: joins the runs"
    _label(ax, "peak learning rate (log scale)", VAL_LOSS, f"{name}: val loss vs learning rate per size ({line})")
    return fig


def heatmap(rows: list[dict[str, Any]], keys: tuple[str, str], name: str) -> Any:
    """Mean val loss per cell of a two-key grid (rows: keys[0], columns: keys[1]); empty cells stay blank."""
    import numpy as np

    done = _done(rows)
    ys = sorted({r[keys[0]] for r in done})
    xs = sorted({r[keys[1]] for r in done})
    cells: dict[tuple[Any, Any], list[float]] = defaultdict(list)
    busy: set[tuple[int, int]] = set()  # cells holding a contended run: their values get a "*"
    for r in done:
        cells[(r[keys[0]], r[keys[1]])].append(float(r["val_loss"]))
        if contended(r):
            busy.add((ys.index(r[keys[0]]), xs.index(r[keys[1]])))
    grid = np.full((len(ys), len(xs)), np.nan)
    for (y, x), values in cells.items():
        grid[ys.index(y), xs.index(x)] = sum(values) / len(values)
    fig = _figure(1.6 + 1.1 * max(len(xs), 3), 1.4 + 0.6 * max(len(ys), 3))
    ax = fig.subplots()
    image = ax.imshow(grid, cmap="viridis_r", aspect="auto")
    ax.set_xticks(range(len(xs)), [f"{x:g}" if isinstance(x, float) else str(x) for x in xs])
    ax.set_yticks(range(len(ys)), [f"{y:g}" if isinstance(y, float) else str(y) for y in ys])
    ax.set_xlabel(keys[1])
    ax.set_ylabel(keys[0])
    finite = grid[np.isfinite(grid)]
    middle = float(finite.mean()) if finite.size else 0.0
    for (iy, ix), value in np.ndenumerate(grid):
        if np.isfinite(value):
            ax.text(ix, iy, f"{value:.3f}{'*' if (iy, ix) in busy else ''}", ha="center", va="center",
                    fontsize="small", color="white" if value > middle else "black")
    fig.colorbar(image, ax=ax, label=f"mean {VAL_LOSS}")
    ax.set_title(f"{name}: val loss over {keys[0]} x {keys[1]}" + ("\n* a contended run (machine busy)" if busy
                                                                      else ""))
    return fig


def target_rows(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The finished runs with a target: those that reached it, fastest first, and those that did not."""
    done = [r for r in rows if r.get("status") == DONE and finite(r.get("target_loss"))]
    hits = sorted((r for r in done if reached(r)), key=lambda r: float(r["seconds_to_target"]))
    return hits, [r for r in done if not reached(r)]


def time_to_target(rows: list[dict[str, Any]], name: str) -> Any:
    """One bar per run that reached its target (training seconds to it, coloured by d_model), fastest at the
    top; below them an x at zero for each run that finished without reaching it."""
    hits, missed = target_rows(rows)
    ordered = [*hits, *missed]
    fig = _figure(9, 1.6 + ROW_INCHES * max(len(ordered), 4))
    ax = fig.subplots()
    sizes = sorted({r.get("d_model") for r in ordered}, key=str)
    colours = {d: f"C{i % 10}" for i, d in enumerate(sizes)}
    for d in sizes:
        ys = [i for i, r in enumerate(hits) if r.get("d_model") == d]
        ax.barh(ys, [float(hits[i]["seconds_to_target"]) for i in ys], color=colours[d], label=f"d_model {d}")
    busy = [i for i, r in enumerate(hits) if contended(r)]
    if busy:
        ax.barh(busy, [float(hits[i]["seconds_to_target"]) for i in busy], fill=False, hatch="//",
                edgecolor="black", label=CONTENDED_LABEL)
    if missed:
        ax.scatter([0.0] * len(missed), range(len(hits), len(ordered)), marker="x", color="black",
                   label="not reached")
    ax.set_yticks(range(len(ordered)), [str(r["run_id"]) for r in ordered], fontsize="x-small")
    ax.invert_yaxis()
    targets = ", ".join(sorted({f"{float(r['target_loss']):g}" for r in ordered}))
    _label(ax, "training seconds to the target (backend time, excluding evaluation and checkpoints)", "run",
           f"{name}: time to train loss <= {targets} ({len(hits)} of {len(ordered)} finished runs reached it)")
    return fig


def grid_keys(sweep_dir: Path) -> list[str]:
    """The grid's axes; a linked entry ({d_model: 16, steps: 43302}, ...) is labelled by its first key."""
    spec = yaml.safe_load((sweep_dir / SPEC_NAME).read_text(encoding="utf-8")) or {}
    grid = spec.get("grid") or {}
    return [next(iter(values[0])) if isinstance(values[0], dict) else key for key, values in grid.items()]


def sweep_figures(sweep_dir: Path) -> dict[str, Any]:
    name = sweep_dir.resolve().name
    rows = read_results(sweep_dir)
    if not _done(rows):
        raise ConfigError(f"{sweep_dir}: no finished runs to plot yet")
    figures = {f"{name}_pareto": pareto(rows, name), f"{name}_loss_vs_lr": loss_vs_lr(rows, name)}
    keys = grid_keys(sweep_dir) if (sweep_dir / SPEC_NAME).is_file() else []
    if len(keys) == 2:
        figures[f"{name}_heatmap"] = heatmap(rows, (keys[0], keys[1]), name)
    if has_target(rows) and any(target_rows(rows)):
        figures[f"{name}_time_to_target"] = time_to_target(rows, name)
    best = {}
    for r in _done(rows)[:BEST_CURVES]:
        records = [m for m in RunDir(sweep_dir / RUNS_DIR / r["run_id"]).read_metrics() if curve_problem(m) is None]
        if records:
            best[r["run_id"]] = records
    if best:
        figures[f"{name}_curves"] = loss_curves(best, f"{name}: best {len(best)} runs")
    return figures


# ---- bench --json -----------------------------------------------------------------------------------------


def bench_figures(path: Path, payload: dict[str, Any]) -> dict[str, Any]:
    name = path.stem
    fig = _figure()
    ax = fig.subplots()
    by_backend: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in payload.get("speed") or []:
        by_backend[row["backend"]].append(row)
    for backend, rows in sorted(by_backend.items()):
        rows.sort(key=lambda r: r["d_model"])
        ax.plot([r["d_model"] for r in rows], [r["us_per_step"] for r in rows], marker="o", label=backend)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    _plain_log(ax.xaxis, sorted({r["d_model"] for r in payload.get("speed") or []}))
    _plain_log(ax.yaxis)
    batch = next((r["batch"] for r in payload.get("speed") or []), "?")
    _label(ax, "d_model (log scale)", "time per training step (us, log scale)",
           f"{name}: us/step per backend and size (batch {batch})")
    figures = {f"{name}_speed": fig}
    scaling = payload.get("batch_scaling") or []
    if scaling:
        fig = _figure()
        ax = fig.subplots()
        by_size: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for row in scaling:
            by_size[row["d_model"]].append(row)
        for d, rows in sorted(by_size.items()):
            rows.sort(key=lambda r: r["batch"])
            ax.plot([r["batch"] for r in rows], [r["us_per_sample"] for r in rows], marker="o", label=f"d_model {d}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        _plain_log(ax.xaxis, sorted({r["batch"] for r in scaling}))
        _plain_log(ax.yaxis)
        _label(ax, "batch (names per step, log scale)", "time per sample (us, log scale)",
               f"{name}: batch scaling on {scaling[0]['backend']}")
        figures[f"{name}_batch_scaling"] = fig
    return figures


# ---- inputs -----------------------------------------------------------------------------------------------


def build_figures(paths: list[Path]) -> dict[str, Any]:
    """Figures by output name for every input; run directories share one loss-curve figure."""
    figures: dict[str, Any] = {}
    runs: dict[str, list[dict[str, Any]]] = {}
    for path in paths:
        if path.is_dir() and (path / JSONL_NAME).is_file():
            figures.update(sweep_figures(path))
        elif path.is_dir() and ((path / METRICS_NAME).is_file() or (path / CONFIG_NAME).is_file()):
            runs[run_label(RunDir(path))] = run_records(path)
        elif path.is_file():
            try:
                payload = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                raise ConfigError(f"{path}: not a `eemicrogpt bench --json` file ({e})") from None
            if not isinstance(payload, dict) or "speed" not in payload:
                raise ConfigError(f"{path}: not a `eemicrogpt bench --json` file (no 'speed' section)")
            try:
                figures.update(bench_figures(path, payload))
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise ConfigError(f"{path}: not a `eemicrogpt bench --json` file (a row lacks or mistypes "
                                  f"{e})") from None
        elif path.exists():
            raise ConfigError(f"{path}: not a run directory, a sweep directory or a bench --json file")
        else:
            raise ConfigError(f"{path}: no such file or directory")
    if runs:
        figures["loss_curves"] = loss_curves(runs)
    return figures


PLOTS_KIND = "plots"  # the marker of a figures directory plot made (base/ownership.py)


def plot_command(paths: list[Path], out: Path, fmt: str = "png") -> list[Path]:
    """Write the figures into out. A directory plot made (and marked) has its figures replaced by a re-run;
    in any other directory only new files are written, and an existing one (or a link) is refused before any
    figure is written."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    figures = build_figures(paths)
    out = resolved_dir(user_path(out, "--out"))
    targets = {name: out / f"{name}.{fmt}" for name in figures}
    try:
        if not out.exists():
            out.mkdir(parents=True)
            mark_directory(out, PLOTS_KIND)
        ours = made_by_eemicrogpt(out, PLOTS_KIND)
        if not ours:
            taken = [t for t in targets.values() if os.path.lexists(t)]
            if taken:
                raise ConfigError(f"{taken[0]} already exists and --out {out} was not made by eemicrogpt plot; choose "
                                  "a new --out (plot never replaces a file it did not create)")
        written = []
        for name, fig in figures.items():
            buf = io.BytesIO()
            fig.savefig(buf, format=fmt)
            write = atomic_write_bytes if ours else atomic_create_bytes
            write(targets[name], buf.getvalue())
            written.append(targets[name])
    except FileExistsError as e:  # made between the check and the write
        raise ConfigError(f"{e.filename} already exists; choose a new --out") from None
    except OSError as e:
        raise StorageError(describe_os_error(e, "cannot write the figures")) from None
    return written
