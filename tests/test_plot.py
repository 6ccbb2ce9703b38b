"""`eemicrogpt plot`: each figure's content checked through matplotlib's objects (plotted values against the
files they come from, labels, legends), not pixels. Inputs are written by the project's own writers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from eemicrogpt_core.interface.cli import app
from eemicrogpt_core.sweep.results import ResultStore
from eemicrogpt_core.tools import bench
from eemicrogpt_core.tools.plot import build_figures, pareto_front
from eemicrogpt_core.training.rundir import RunDir

pytest.importorskip("matplotlib", reason="matplotlib not installed: pip install 'eemicrogpt[plot]'")

# (d_model, lr, status, val_loss, train_s); the two d16 runs at lr 0.01 differ by seed.
RUNS = [
    (16, 0.003, "done", 2.30, 0.5), (16, 0.01, "done", 2.20, 1.0), (16, 0.01, "done", 2.24, 2.0),
    (16, 0.03, "done", 2.25, 4.0), (32, 0.003, "done", 2.40, 0.5), (32, 0.01, "done", 2.10, 2.0),
    (32, 0.03, "failed", None, None),
]


def metrics(n: int, scale: float) -> list[dict]:
    return [{"step": 100 * i, "train_loss": 3.0 - scale * i, "val_loss": 3.1 - scale * i, "lr": 0.01,
             "elapsed_s": 0.25 * i, "us_per_step": 50.0} for i in range(1, n + 1)]


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    out = tmp_path / "demo"
    out.mkdir()
    (out / "spec.yaml").write_text(yaml.safe_dump({"name": "demo", "grid": {"d_model": [16, 32],
                                                                          "lr": [0.003, 0.01, 0.03]}}))
    store = ResultStore(out, ["d_model", "lr", "seed"])
    for i, (d, lr, status, val, train_s) in enumerate(RUNS):
        rid = f"run{i}"
        record = {"run_id": rid, "d_model": d, "lr": lr, "seed": i, "status": status}
        if status == "done":
            record.update(val_loss=val, train_loss=val - 0.05, train_s=train_s, steps=100, us_per_step=10.0)
            run = RunDir(out / "runs" / rid)
            run.path.mkdir(parents=True)
            for m in metrics(4, 0.1 + 0.01 * i):
                run.append_metric(m)
        else:
            record["error"] = "boom"
        store.add(record)
    return out


def series(ax: object) -> dict[str, tuple[list[float], list[float]]]:
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}


def test_pareto_frontier_per_d_model_matches_the_results_file(sweep_dir: Path) -> None:
    fig = build_figures([sweep_dir])["demo_pareto"]
    ax = fig.axes[0]
    lines = series(ax)
    # d16: (0.5, 2.30), (1.0, 2.20) improve; (2.0, 2.24) and (4.0, 2.25) are beaten by (1.0, 2.20).
    assert lines["d_model 16 frontier"] == ([0.5, 1.0], [2.30, 2.20])
    assert lines["d_model 32 frontier"] == ([0.5, 2.0], [2.40, 2.10])
    scatter = {c.get_label(): c.get_offsets().tolist() for c in ax.collections}
    assert sorted(scatter["d_model 16 runs"]) == [[0.5, 2.30], [1.0, 2.20], [2.0, 2.24], [4.0, 2.25]]
    assert sorted(scatter["d_model 32 runs"]) == [[0.5, 2.40], [2.0, 2.10]]  # the failed run is not plotted
    assert ax.get_xscale() == "log" and "(s" in ax.get_xlabel() and "validation loss" in ax.get_ylabel()
    assert "Pareto" in ax.get_title()
    assert {t.get_text() for t in ax.get_legend().get_texts()} >= {"d_model 16 frontier", "d_model 32 runs"}


def test_pareto_front_keeps_only_points_nobody_beats() -> None:
    assert pareto_front([(3, 1.0), (1, 2.0), (2, 2.5), (4, 0.5), (5, 0.7)]) == [(1, 2.0), (3, 1.0), (4, 0.5)]


def test_loss_vs_lr_plots_the_mean_per_lr_per_size(sweep_dir: Path) -> None:
    ax = build_figures([sweep_dir])["demo_loss_vs_lr"].axes[0]
    lines = series(ax)
    xs, ys = lines["d_model 16"]
    assert xs == [0.003, 0.01, 0.03] and ys == pytest.approx([2.30, 2.22, 2.25])  # 2.22: mean of two seeds
    assert lines["d_model 32"] == ([0.003, 0.01], [2.40, 2.10])
    assert ax.get_xscale() == "log" and "learning rate" in ax.get_xlabel() and "loss" in ax.get_ylabel()
    assert ax.get_title().endswith("(line: mean over seed)")  # the two d16 runs at lr 0.01 differ by seed


def test_loss_vs_lr_names_every_key_it_averages_and_spaces_its_ticks(tmp_path: Path) -> None:
    from eemicrogpt_core.tools.plot import loss_vs_lr

    # Two heads counts per learning rate, and two learning rates 6% apart (a log-uniform draw can do that).
    rows = [{"run_id": f"r{i}", "d_model": 16, "n_heads": h, "lr": lr, "status": "done", "val_loss": 2.0 + i / 100,
             "train_s": 1.0} for i, (h, lr) in enumerate([(2, 0.002078), (4, 0.002078), (2, 0.002198), (4, 0.01)])]
    ax = loss_vs_lr(rows, "s").axes[0]
    assert ax.get_title() == "s: val loss vs learning rate per size (line: mean over n_heads)"
    assert list(ax.xaxis.get_major_locator().tick_values(0, 1)) == [0.002078, 0.01]
    lone = loss_vs_lr([dict(rows[0], run_id="x")], "t").axes[0]
    assert lone.get_title().endswith("(line: joins the runs)")


def test_heatmap_for_a_two_key_grid(sweep_dir: Path) -> None:
    fig = build_figures([sweep_dir])["demo_heatmap"]
    ax = fig.axes[0]
    image = ax.get_images()[0].get_array()
    expected = np.array([[2.30, 2.22, 2.25], [2.40, 2.10, np.nan]])  # rows d_model 16, 32; columns lr
    assert np.allclose(image.filled(np.nan), expected, equal_nan=True)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0.003", "0.01", "0.03"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["16", "32"]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("lr", "d_model")
    assert "2.220" in [t.get_text() for t in ax.texts]
    assert "validation loss" in fig.axes[1].get_ylabel()  # the colour bar


def test_sweep_curves_show_the_best_runs_from_their_metrics(sweep_dir: Path) -> None:
    fig = build_figures([sweep_dir])["demo_curves"]
    by_step, by_time = fig.axes
    best = "run5"  # val 2.10
    m = RunDir(sweep_dir / "runs" / best).read_metrics()
    assert series(by_step)[f"{best} train"] == ([r["step"] for r in m], [r["train_loss"] for r in m])
    assert series(by_time)[f"{best} val"] == ([r["elapsed_s"] for r in m], [r["val_loss"] for r in m])
    assert len(by_step.get_lines()) == 2 * 6  # the best six finished runs, train and val each


def test_run_directories_are_overlaid(tmp_path: Path) -> None:
    dirs = []
    for name, scale in (("a", 0.1), ("b", 0.2)):
        run = RunDir(tmp_path / name)
        run.path.mkdir()
        for m in metrics(3, scale):
            run.append_metric(m)
        dirs.append(run.path)
    figures = build_figures(dirs)
    assert list(figures) == ["loss_curves"]
    by_step, by_time = figures["loss_curves"].axes
    lines = series(by_step)
    assert set(lines) == {"a train", "a val", "b train", "b val"}
    assert lines["b val"] == ([100, 200, 300], pytest.approx([2.9, 2.7, 2.5]))
    assert by_step.get_xlabel() == "step" and by_time.get_xlabel() == "wall-clock time (s)"
    assert "loss" in by_step.get_ylabel() and by_time.get_legend() is not None


def bench_payload() -> dict:
    def row(backend: str, d: int, batch: int, us: float) -> bench.BenchRow:
        return bench.BenchRow(backend, d, 4, batch, us, us / batch, 1e6 / us, 1.0, None, 100.0, 1000, 5)

    speed = [row("avx512", d, 16, us) for d, us in ((16, 22.5), (32, 60.0), (64, 195.0))]
    speed += [row("numpy_ref", d, 16, us) for d, us in ((16, 330.0), (32, 420.0), (64, 875.0))]
    scaling = [row("avx512", d, b, us) for d in (16, 64) for b, us in ((1, 4.0 * d), (16, 20.0 * d), (64, 70.0 * d))]
    return bench.as_json(speed=speed, batch_scaling=scaling, loss_at=[], notes=[], peak_gflops=None)


def test_bench_json_speed_and_batch_scaling(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    payload = bench_payload()
    path.write_text(json.dumps(payload))
    figures = build_figures([path])
    ax = figures["bench_speed"].axes[0]
    lines = series(ax)
    assert lines["avx512"] == ([16, 32, 64], [22.5, 60.0, 195.0])
    assert lines["numpy_ref"] == ([16, 32, 64], [330.0, 420.0, 875.0])
    assert "us" in ax.get_ylabel() and "d_model" in ax.get_xlabel() and "batch 16" in ax.get_title()
    ax = figures["bench_batch_scaling"].axes[0]
    xs, ys = series(ax)["d_model 64"]
    assert xs == [1, 16, 64] and ys == pytest.approx([4.0 * 64 / 1, 20.0 * 64 / 16, 70.0 * 64 / 64])
    assert "per sample" in ax.get_ylabel() and "batch" in ax.get_xlabel() and "avx512" in ax.get_title()


def test_cli_writes_png_and_svg_files(sweep_dir: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["plot", str(sweep_dir), "--out", str(tmp_path / "png")])
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in (tmp_path / "png").iterdir() if not p.name.startswith("."))  # not the marker
    assert written == ["demo_curves.png", "demo_heatmap.png", "demo_loss_vs_lr.png", "demo_pareto.png"]
    assert (tmp_path / "png" / "demo_pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = runner.invoke(app, ["plot", str(sweep_dir), "--out", str(tmp_path / "svg"), "--format", "svg"])
    assert result.exit_code == 0
    assert "<svg" in (tmp_path / "svg" / "demo_pareto.svg").read_text()[:2000]


def test_cli_bad_inputs_are_one_line_errors(tmp_path: Path, sweep_dir: Path) -> None:
    runner = CliRunner()
    cases = [
        (["plot", str(tmp_path / "missing")], "no such file or directory"),
        (["plot", str(sweep_dir), "--format", "jpg"], "--format must be one of png, svg"),
        (["plot", str(sweep_dir / "spec.yaml")], "not a `eemicrogpt bench --json` file"),
    ]
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and message in result.output and len(result.output.strip().splitlines()) == 1


def test_without_matplotlib_plot_says_how_to_install_it(sweep_dir: Path, tmp_path: Path) -> None:
    code = "import sys; sys.modules['matplotlib'] = None; from eemicrogpt_core.interface.cli import app; app()"
    proc = subprocess.run([sys.executable, "-c", code, "plot", str(sweep_dir), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "pip install 'eemicrogpt[plot]'" in proc.stderr


def test_heatmap_of_a_linked_grid_key_uses_its_first_key(sweep_dir: Path) -> None:
    linked = [{"d_model": 16, "steps": 400}, {"d_model": 32, "steps": 100}]
    (sweep_dir / "spec.yaml").write_text(yaml.safe_dump({"name": "demo", "grid": {"size": linked,
                                                                                  "lr": [0.003, 0.01, 0.03]}},
                                                     sort_keys=False))  # as the sweep writes it: grid order kept
    ax = build_figures([sweep_dir])["demo_heatmap"].axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("lr", "d_model")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["16", "32"]


@pytest.mark.parametrize(("lines", "message"), [
    ('{"step": 2}\n', "metrics.jsonl:1: a metrics record that cannot be plotted: it has no train_loss"),
    ('{"step": 2, "train_loss": "3.2", "val_loss": 3.3, "elapsed_s": 1.0}\n',
     "metrics.jsonl:1: a metrics record that cannot be plotted: train_loss is '3.2', not a number"),
    (json.dumps(metrics(1, 0.1)[0]) + "\n" + '{"step": 200, "train_loss": 2.5, "val_loss": null, "elapsed_s": 2}\n',
     "metrics.jsonl:2: a metrics record that cannot be plotted: val_loss is None, not a number"),
    ("garbage\n\x00\x01 more garbage\n[1, 2]\n", "metrics.jsonl: none of its 3 lines is a metrics record; it is not a "
     "log that eemicrogpt wrote"),
    ("", "the run has logged no metrics yet"),
])
def test_unplottable_metrics_are_one_line_errors(lines: str, message: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(lines)
    result = CliRunner().invoke(app, ["plot", str(run), "--out", str(tmp_path / "plots")])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and message in result.output
    assert not (tmp_path / "plots").exists()


def test_a_half_written_last_metrics_line_is_still_skipped(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    for m in metrics(3, 0.1):
        run.append_metric(m)
    with run.metrics_path.open("a") as f:
        f.write('{"step": 400, "train_lo')  # a full disk cut the save short
    by_step = build_figures([run.path])["loss_curves"].axes[0]
    assert series(by_step)["run train"][0] == [100, 200, 300]


def test_a_malformed_bench_json_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"speed": [{"backend": "x"}]}))
    result = CliRunner().invoke(app, ["plot", str(path), "--out", str(tmp_path / "plots")])
    assert result.exit_code == 2 and "not a `eemicrogpt bench --json` file" in result.output
    assert len(result.output.strip().splitlines()) == 1


# (run id, d_model, status, reached, seconds_to_target): a target sweep's results, out of order.
TARGET_RUNS = [
    ("slow", 32, "done", True, 2.5), ("fast", 16, "done", True, 0.75), ("never", 16, "done", False, None),
    ("gone", 32, "unavailable", None, None), ("mid", 32, "done", True, 1.25),
]


def test_time_to_target_draws_each_finished_run(tmp_path: Path) -> None:
    out = tmp_path / "ttt"
    out.mkdir()
    (out / "spec.yaml").write_text(yaml.safe_dump({"name": "ttt", "grid": {"d_model": [16, 32]}}))
    store = ResultStore(out, ["d_model"])
    for rid, d, status, reached, seconds in TARGET_RUNS:
        record = {"run_id": rid, "d_model": d, "lr": 0.01, "status": status, "target_loss": 2.0}
        if status == "done":
            record.update(val_loss=2.1, train_loss=2.0, train_s=3.0, steps=100, us_per_step=10.0, reached=reached,
                          steps_to_target=50 if reached else None, seconds_to_target=seconds)
        store.add(record)
    figures = build_figures([out])
    ax = figures["ttt_time_to_target"].axes[0]
    # Fastest first (the y axis is inverted: row 0 on top), then the run that did not reach it.
    assert [t.get_text() for t in ax.get_yticklabels()] == ["fast", "mid", "slow", "never"]
    bars = sorted((p.get_y() + p.get_height() / 2, p.get_width()) for p in ax.patches)
    assert bars == [(0.0, 0.75), (1.0, 1.25), (2.0, 2.5)]
    missed = {c.get_label(): c.get_offsets().tolist() for c in ax.collections}["not reached"]
    assert missed == [[0.0, 3.0]]
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {"d_model 16", "d_model 32", "not reached"}
    assert "train loss <= 2" in ax.get_title() and "3 of 4 finished runs" in ax.get_title()
    assert "seconds" in ax.get_xlabel()
    written = CliRunner().invoke(app, ["plot", str(out), "--out", str(tmp_path / "plots")])
    assert written.exit_code == 0, written.output
    assert (tmp_path / "plots" / "ttt_time_to_target.png").stat().st_size > 0


def test_no_time_to_target_chart_without_a_target(sweep_dir: Path) -> None:
    assert not any(name.endswith("_time_to_target") for name in build_figures([sweep_dir]))


def test_contended_runs_are_marked_in_every_sweep_chart(tmp_path: Path) -> None:
    """A run the sweep marked contended: ringed in the Pareto and lr charts, starred in the heatmap, hatched in
    the time-to-target bars; uncontended runs are not."""
    out = tmp_path / "busy"
    out.mkdir()
    (out / "spec.yaml").write_text(yaml.safe_dump({"name": "busy", "grid": {"d_model": [16, 32],
                                                                          "lr": [0.003, 0.01]}}))
    store = ResultStore(out, ["d_model", "lr"])
    for i, (d, lr, busy) in enumerate([(16, 0.003, False), (16, 0.01, True), (32, 0.003, False), (32, 0.01, False)]):
        store.add({"run_id": f"run{i}", "d_model": d, "lr": lr, "status": "done", "val_loss": 2.2 - 0.01 * i,
                   "train_loss": 2.1, "train_s": 1.0 + i, "steps": 100, "us_per_step": 10.0, "contended": busy,
                   "target_loss": 2.5, "reached": True, "seconds_to_target": 0.5 + i, "steps_to_target": 50})
    figures = build_figures([out])
    for chart, (x, y) in (("busy_pareto", (2.0, 2.19)), ("busy_loss_vs_lr", (0.01, 2.19))):
        ax = figures[chart].axes[0]
        rings = {c.get_label(): c.get_offsets().tolist() for c in ax.collections}
        ringed = [key for key in rings if key.startswith("contended run")]
        assert len(ringed) == 1 and rings[ringed[0]] == [pytest.approx([x, y])], chart
    texts = [t.get_text() for t in figures["busy_heatmap"].axes[0].texts]
    assert "2.190*" in texts and "2.200" in texts and "contended" in figures["busy_heatmap"].axes[0].get_title()
    ax = figures["busy_time_to_target"].axes[0]
    hatched = [p for p in ax.patches if p.get_hatch() == "//"]
    assert len(hatched) == 1 and hatched[0].get_width() == 1.5
