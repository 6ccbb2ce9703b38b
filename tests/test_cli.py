"""The CLI end to end (typer's CliRunner) on the real names file with numpy_ref, and every bad input."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
import urllib.error
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer.main
from typer.testing import CliRunner

from eemicrogpt_core.backends.backend import BackendSpec, ProbeResult
from eemicrogpt_core.backends.hookspec import hookimpl
from eemicrogpt_core.backends.registry import load_registry
from eemicrogpt_core.base.errors import ConfigError
from eemicrogpt_core.base.shipped import shipped
from eemicrogpt_core.data import datafile
from eemicrogpt_core.interface import cli
from eemicrogpt_core.training import config, runs
from eemicrogpt_core.training.checkpoint import load_checkpoint
from eemicrogpt_core.training.config import TrainConfig
from eemicrogpt_core.training.progress import format_record, rate_text
from eemicrogpt_core.training.rundir import RunDir
from eemicrogpt_core.training.trainer import NullReporter, train

UNIFORM_LOSS = 3.296
# 256 distinct characters, each twice except U+0150 (once): one more than a vocabulary holds
MANY_CHARACTERS = "".join(map(chr, range(0x100, 0x200))) + "\n" + "".join(map(chr, range(0x100, 0x200))).replace(
    "\u0150", "") + "\n"
RUNNER = CliRunner()


def run(*args: str, env: dict[str, str] | None = None):
    base = {"EEMICROGPT_BACKEND": None, "EEMICROGPT_DATA": None}
    return RUNNER.invoke(cli.app, list(args), env={**base, **(env or {})})


def assert_one_line_error(result, *fragments: str) -> None:
    assert result.exit_code != 0, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("eemicrogpt: error: ")
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture(scope="module")
def trained(names_file: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    out = tmp_path_factory.mktemp("cli") / "run"
    result = run("train", "--backend", "numpy_ref", "--data", str(names_file), "--d-model", "16", "--steps", "300",
                 "--lr", "0.01", "--log-every", "100", "--out", str(out))
    assert result.exit_code == 0, result.output
    return out, result


def test_train_end_to_end(trained: tuple[Path, Any]) -> None:
    out, result = trained
    text = result.stdout
    assert "backend numpy_ref" in text and "step 300/300" in text and "us/step" in text
    samples = next(line for line in text.splitlines() if line.startswith("samples: "))
    assert len(samples.removeprefix("samples: ").split(", ")) == 10
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [100, 200, 300]
    assert records[-1]["train_loss"] < UNIFORM_LOSS - 0.7 and records[-1]["val_loss"] < UNIFORM_LOSS - 0.7
    assert {p.name for p in out.iterdir()} >= {"config.yaml", "metrics.jsonl", "checkpoint.npz"}
    assert "backend: numpy_ref" in (out / "config.yaml").read_text()


def test_sample_command(trained: tuple[Path, Any]) -> None:
    out, _ = trained
    result = run("sample", str(out), "-n", "7", "--temperature", "0.8", "--seed", "1")
    assert result.exit_code == 0, result.output
    names = result.stdout.split()
    assert len(names) == 7 and all(n.isalpha() and n.islower() for n in names)
    assert run("sample", str(out), "-n", "7", "--temperature", "0.8", "--seed", "1").stdout == result.stdout


def test_resume_of_finished_run_and_refusal_to_overwrite(trained: tuple[Path, Any], names_file: Path) -> None:
    out, _ = trained
    result = run("train", "--resume", str(out))
    assert result.exit_code == 0 and "already finished" in result.stdout
    assert_one_line_error(run("train", "--data", str(names_file), "--out", str(out)), "already holds a run")
    assert_one_line_error(run("train", "--resume", str(out), "--lr", "0.1"), "--resume continues", "--lr")


def test_resume_via_cli_continues_exactly(names_file: Path, tmp_path: Path) -> None:
    full = tmp_path / "full"
    args = ("--backend", "numpy_ref", "--data", str(names_file), "--d-model", "16", "--log-every", "20")
    assert run("train", *args, "--steps", "40", "--out", str(full)).exit_code == 0
    # The same run, stopped at step 20 (as Ctrl-C would), then continued from the command line.
    cfg = dataclasses.replace(load_checkpoint(full / "checkpoint.npz").config, out=str(tmp_path / "half"))
    stopped = train(cfg, load_registry(), run_dir=RunDir.create(cfg.out, cfg), reporter=_Stop20())
    assert stopped.interrupted and stopped.steps_run == 20
    result = run("train", "--resume", cfg.out)
    assert result.exit_code == 0, result.output
    assert "resuming at step 20 of 40" in result.stdout
    resumed = load_checkpoint(Path(cfg.out) / "checkpoint.npz").state
    assert resumed.step == 40
    assert np.array_equal(resumed.params, load_checkpoint(full / "checkpoint.npz").state.params)


class _Stop20(NullReporter):
    def progress(self, step: int, total: int, train_loss: float) -> None:
        if step >= 20:
            raise KeyboardInterrupt


def test_backends_json_and_table() -> None:
    result = run("backends", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    numpy_ref = next(b for b in report["backends"] if b["name"] == "numpy_ref")
    assert numpy_ref["available"] and numpy_ref["distribution"] == "eemicrogpt-backend-numpy"
    assert report["auto"] is not None and set(report["auto_by_d_model"]) == {"16", "32", "64", "128"}
    table = run("backends")
    assert table.exit_code == 0 and "numpy_ref" in table.stdout and "auto picks:" in table.stdout


class _Unavailable:
    @hookimpl
    def eemicrogpt_backends(self) -> list[BackendSpec]:
        return [BackendSpec("fake_sme2", "never here", lambda: ProbeResult.no("requires aarch64 with FEAT_SME2"),
                            lambda shape, batch, dtype: None)]


def test_unavailable_backend_is_one_line(monkeypatch: pytest.MonkeyPatch, names_file: Path, tmp_path: Path) -> None:
    monkeypatch.setattr(cli, "load_registry", lambda: load_registry(extra_plugins=[_Unavailable()]))
    result = run("train", "--backend", "fake_sme2", "--data", str(names_file), "--out", str(tmp_path / "r"))
    assert_one_line_error(result, "fake_sme2", "unavailable", "requires aarch64 with FEAT_SME2", "numpy_ref")
    assert not (tmp_path / "r").exists()  # nothing created for a run that cannot start
    listed = json.loads(run("backends", "--json").stdout)
    fake = next(b for b in listed["backends"] if b["name"] == "fake_sme2")
    assert not fake["available"] and fake["reason"] == "requires aarch64 with FEAT_SME2"


def test_no_backend_installed_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, names_file: Path, tmp_path: Path
) -> None:
    monkeypatch.setattr(cli, "load_registry", lambda: load_registry(entry_points=False))
    result = run("train", "--data", str(names_file), "--out", str(tmp_path / "r"))
    assert_one_line_error(result, "no eemicrogpt backend is installed", "pip install")
    assert "no backend installed" in run("backends").stdout


class _Broken:
    @hookimpl
    def eemicrogpt_backends(self) -> list[BackendSpec]:
        raise RuntimeError("plugin exploded")


def test_broken_plugin_is_listed_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "load_registry", lambda: load_registry(extra_plugins=[_Broken()]))
    report = json.loads(run("backends", "--json").stdout)
    assert any("plugin exploded" in f["error"] for f in report["plugin_failures"])
    assert report["auto"] is not None  # the other backends still work
    table = run("backends")
    assert table.exit_code == 0 and "broken plugin" in table.stdout and "plugin exploded" in table.stdout


def test_env_backend_is_used_and_flag_wins(names_file: Path, tmp_path: Path) -> None:
    result = run("train", "--data", str(names_file), "--out", str(tmp_path / "r"), env={"EEMICROGPT_BACKEND": "nope"})
    assert_one_line_error(result, "unknown backend 'nope'")
    ok = run("train", "--backend", "numpy_ref", "--data", str(names_file), "--d-model", "16", "--steps", "5",
             "--out", str(tmp_path / "r2"), env={"EEMICROGPT_BACKEND": "nope"})
    assert ok.exit_code == 0, ok.output


@pytest.mark.parametrize(
    ("files", "args", "fragments"),
    [
        ({}, ["--data", "{tmp}/absent.txt"], ["names file not found"]),
        ({"bad.txt": "anna\nb\x01b\n"}, ["--data", "{tmp}/bad.txt"], ["bad.txt:2", "control character U+0001"]),
        ({"many.txt": MANY_CHARACTERS}, ["--data", "{tmp}/many.txt"],
         ["256 distinct characters", "at most 255", "The 1 rarest: Ő;"]),
        ({"c.yaml": "n_layers: 13\n"}, ["--config", "{tmp}/c.yaml"], ["n_layers must be 1..12, got 13"]),
        ({"c.yaml": "context: 257\n"}, ["--config", "{tmp}/c.yaml"], ["context must be 1..256, got 257"]),
        ({"c.yaml": "d_model: [16\n"}, ["--config", "{tmp}/c.yaml"], ["c.yaml:", "malformed YAML"]),
        ({"c.yaml": "d_modle: 16\n"}, ["--config", "{tmp}/c.yaml"], ["unknown key 'd_modle'", "c.yaml"]),
        ({}, ["--config", "{tmp}/absent.yaml"], ["absent.yaml: no such file, and not a shipped config "
                                                 "(shipped: d16, d32, d64, d128"]),
        ({}, ["--config", "d24"], ["--config d24: no such file, and not a shipped config (shipped: d16, d32"]),
        ({}, ["--d-model", "30", "--n-heads", "4"], ["n_heads must divide d_model 30"]),
        ({}, ["--batch", "0"], ["batch must be >= 1"]),
        ({}, ["--lr", "-1"], ["lr must be"]),
        ({}, ["--backend", "avx9000"], ["unknown backend 'avx9000'", "numpy_ref"]),
        ({}, ["--steps", "many"], ["--steps", "--help"]),
        ({}, ["--no-such-flag"], ["No such option"]),
    ],
)
def test_bad_input_gives_one_line(
    files: dict[str, str], args: list[str], fragments: list[str], names_file: Path, tmp_path: Path
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--data" not in args:
        args += ["--data", str(names_file)]
    result = run("train", "--out", str(tmp_path / "run"), *args)
    assert_one_line_error(result, *fragments)


def test_offline_without_a_names_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def offline(url: str) -> bytes:
        raise urllib.error.URLError("Temporary failure in name resolution")

    monkeypatch.setattr(datafile, "urllib_fetch", offline)
    result = run("train", "--backend", "numpy_ref", "--out", str(tmp_path / "r"),
                 env={"EEMICROGPT_CACHE_DIR": str(tmp_path / "cache")})
    assert_one_line_error(result, "cannot download", "--data PATH", "EEMICROGPT_DATA")


def test_sample_bad_inputs(trained: tuple[Path, Any], tmp_path: Path) -> None:
    out, _ = trained
    assert_one_line_error(run("sample", str(tmp_path)), "no checkpoint.npz")
    assert_one_line_error(run("train", "--resume", str(tmp_path / "nowhere")), "run directory not found")
    assert_one_line_error(run("sample", str(out), "--temperature", "-1"), "--temperature must be a finite number >= 0")
    assert_one_line_error(run("sample", str(out), "--prefix", "é"), "the prefix's character 'é'")


def test_console_script_error_has_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "from eemicrogpt_core.interface.cli import app; app()", "train", "--config",
         str(tmp_path / "absent.yaml")],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"eemicrogpt: error: --config {tmp_path}/absent.yaml: no such file, and not a shipped config (shipped: "
        f"{', '.join(shipped('config'))}; `eemicrogpt configs` describes them)"]


def test_unknown_backend_is_reported_before_any_download(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def no_download(url: str) -> bytes:
        raise AssertionError(f"tried to download {url} before checking the backend")

    monkeypatch.setattr(datafile, "urllib_fetch", no_download)
    result = run("train", "--backend", "nope", env={"EEMICROGPT_CACHE_DIR": str(tmp_path)})
    assert_one_line_error(result, "unknown backend 'nope'", "Choose one of: auto")


# Every option `train` had before the options were derived from the config schema, spelled as then.
FLAGS = ("--config", "-c", "--backend", "--d-model", "--n-heads", "--batch", "--steps", "--time-budget", "--lr",
         "--seed", "--data", "--drop-invalid", "--out", "--log-every", "--resume", "--allow-data-change", "--threads",
         "--precision")


def test_train_offers_every_config_key_and_keeps_its_flags() -> None:
    command = typer.main.get_command(cli.app).commands["train"]  # type: ignore[attr-defined]
    options = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    assert set(FLAGS) <= options
    assert {"--n-layers", "--context", "--lowercase", "--no-lowercase", "--val-fraction"} <= options
    assert set(config.KEYS) <= {param.name for param in command.params}


def _config_from_flags(monkeypatch: pytest.MonkeyPatch, names_file: Path, *args: str) -> TrainConfig:
    """The config `train` resolves from these arguments, caught before anything is trained or created."""
    seen: list[TrainConfig] = []

    def capture(cfg: TrainConfig, **_: object) -> None:
        seen.append(cfg)
        raise ConfigError("stop")

    monkeypatch.setattr(runs, "check_memory", capture)
    result = run("train", "--data", str(names_file), *args)
    assert len(seen) == 1, result.output
    return seen[0]


def test_new_keys_reach_the_config(monkeypatch: pytest.MonkeyPatch, names_file: Path) -> None:
    cfg = _config_from_flags(monkeypatch, names_file, "--n-layers", "3", "--context", "32", "--lowercase",
                             "--val-fraction", "0")
    assert (cfg.n_layers, cfg.context, cfg.lowercase, cfg.val_fraction) == (3, 32, True, 0.0)
    default = _config_from_flags(monkeypatch, names_file)
    assert (default.n_layers, default.context, default.lowercase, default.val_fraction) == (1, 16, False, 0.1)


def test_a_width_flag_brings_its_preset(monkeypatch: pytest.MonkeyPatch, names_file: Path, tmp_path: Path) -> None:
    assert _config_from_flags(monkeypatch, names_file, "--d-model", "32") == config.preset(32)
    cfg = _config_from_flags(monkeypatch, names_file, "--d-model", "128", "--lr", "0.004")
    assert (cfg.n_heads, cfg.steps, cfg.lr) == (8, 10000, 0.004)
    path = tmp_path / "c.yaml"
    path.write_text("d_model: 16\nsteps: 123\ndrop_invalid: true\n")
    cfg = _config_from_flags(monkeypatch, names_file, "--config", str(path), "--no-drop-invalid")
    assert (cfg.lr, cfg.steps, cfg.drop_invalid) == (0.01, 123, False)  # flag > file > d16's preset


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--n-layers", "13"], "command line: n_layers must be 1..12, got 13"),
        (["--context", "0"], "command line: context must be 1..256, got 0"),
        (["--val-fraction", "1"], "command line: val_fraction must be a finite number in [0, 1), got 1.0"),
        (["--dtype", "int8"], "command line: dtype must be one of float32, float64, float16, got 'int8'"),
        (["--d-model", "30"], "command line: n_heads must divide d_model 30, got 4"),
    ],
)
def test_bad_values_of_the_new_keys(args: list[str], message: str, names_file: Path, tmp_path: Path) -> None:
    result = run("train", "--data", str(names_file), "--out", str(tmp_path / "r"), *args)
    assert_one_line_error(result, message)
    assert not (tmp_path / "r").exists()


def test_resume_refuses_new_shape_keys(trained: tuple[Path, Any]) -> None:
    out, _ = trained
    assert_one_line_error(run("train", "--resume", str(out), "--n-layers", "2", "--lowercase"),
                          "drop --n-layers, --lowercase",
                          "only --backend, --data, --drop-invalid, --log-to, --sample-every, --threads may change")
    # a switch is named with the key's own flag: the user may have typed either
    assert_one_line_error(run("train", "--resume", str(out), "--text"), "drop --data-format/--text ")


def test_val_fraction_reaches_the_run(names_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "r"
    result = run("train", "--backend", "numpy_ref", "--data", str(names_file), "--d-model", "16", "--steps", "4",
                 "--log-every", "4", "--val-fraction", "0.25", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert config.load_config(out / "config.yaml").val_fraction == 0.25
    n_train, n_val = (int(n.replace(",", "")) for n in re.findall(r"([\d,]+) train / ([\d,]+) validation",
                                                                  result.stdout)[0])
    assert n_val == math.ceil(0.25 * (n_train + n_val))


def test_resume_with_steps_extends_a_finished_run(names_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "ext"
    first = run("train", "--d-model", "16", "--steps", "20", "--log-every", "10", "--out", str(out),
                "--backend", "numpy_ref", "--data", str(names_file))
    assert first.exit_code == 0, first.output
    done = run("train", "--resume", str(out))
    assert done.exit_code == 0 and "pass --steps N" in done.output
    more = run("train", "--resume", str(out), "--steps", "30")
    assert more.exit_code == 0, more.output
    assert "extending to 30 steps (from 20)" in more.output and "continues at 0.00" in more.output
    ckpt = load_checkpoint(out / "checkpoint.npz")
    assert (ckpt.state.step, ckpt.total_steps, ckpt.config.steps) == (30, 30, 30)
    fewer = run("train", "--resume", str(out), "--steps", "30")
    assert_one_line_error(fewer, "must be more than the 30 steps")


def test_threads_auto_on_the_command_line_overrides_a_fixed_count(monkeypatch: pytest.MonkeyPatch,
                                                                   names_file: Path, tmp_path: Path) -> None:
    path = tmp_path / "fixed.yaml"
    path.write_text("threads: 2\n")
    assert _config_from_flags(monkeypatch, names_file, "--config", str(path)).threads == 2
    assert _config_from_flags(monkeypatch, names_file, "--config", str(path), "--threads", "auto").threads is None
    assert _config_from_flags(monkeypatch, names_file, "--threads", "3").threads == 3


@pytest.mark.parametrize(
    ("value", "message"),
    [("abc", "'abc' is neither an integer nor 'auto'"), ("2.5", "'2.5' is neither an integer nor 'auto'"),
     ("0", "command line: threads must be >= 1 (or auto), got 0")],
)
def test_bad_threads_values(value: str, message: str, names_file: Path, tmp_path: Path) -> None:
    result = run("train", "--data", str(names_file), "--out", str(tmp_path / "r"), "--threads", value)
    assert_one_line_error(result, message)


class _SmallVocabulary:
    """An available backend whose kernels stop at 27 tokens."""

    @hookimpl
    def eemicrogpt_backends(self) -> list[BackendSpec]:
        return [BackendSpec("fake_v27", "here", lambda: ProbeResult.ok(1),
                            lambda shape, batch, dtype: None, supports=lambda shape: shape.vocab <= 27)]


def test_a_backend_refusing_the_shape_names_the_datas_vocabulary(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    """A user's file is checked with its own vocabulary (34 tokens here, where the names' 27 would pass), and
    before any run directory is created."""
    monkeypatch.setattr(cli, "load_registry", lambda: load_registry(extra_plugins=[_SmallVocabulary()]))
    data = tmp_path / "cities.txt"
    data.write_text("new york\nst. louis\nSan José\nwinston-salem\nmünchen\nQUÉBEC 1608\n")  # 33 symbols
    out = tmp_path / "run"
    result = run("train", "--data", str(data), "--backend", "fake_v27", "--out", str(out))
    assert_one_line_error(result, "backend 'fake_v27' cannot run this configuration",
                          "fake_v27 has no kernel for d64, 4 heads, 1 layer, vocab 34, context 16")
    assert not out.exists()


def test_flags_read_as_flags_in_help() -> None:
    for command in ("sample", "train", "export", "backends"):
        result = run(command, "--help")
        assert result.exit_code == 0
        assert "<bool>" not in result.output, command
    assert "--unique" in run("sample", "--help").output


def test_a_value_after_a_flag_says_the_flag_takes_none(trained: tuple[Path, Any]) -> None:
    out, _ = trained
    result = run("sample", str(out), "--unique", "true")
    assert_one_line_error(result, "unexpected extra argument", "--unique is a flag and takes no value: write "
                          "--unique alone to set it")
    other = run("sample", str(out), "--unique", "extra")
    assert other.exit_code == 2 and "is a flag" not in other.stderr


def test_rates_read_at_every_speed() -> None:
    """Fast runs count steps per second; a model whose step takes seconds says seconds per step, not 0 steps/s."""
    assert rate_text(4_210.7) == "4,211 steps/s"
    assert rate_text(2.46) == "2.5 steps/s"
    assert rate_text(1 / 3.6) == "3.60 s/step"
    line = format_record({"step": 5, "train_loss": 4.38, "val_loss": None, "lr": 5e-5, "us_per_step": 3593957.0}, 27)
    assert line.endswith("3,593,957.0 us/step")


def test_a_budget_shorter_than_the_warm_up_is_warned_about(names_file: Path, tmp_path: Path) -> None:
    """A budget that fits fewer steps than warmup_steps trains (the config cannot know the count) but says the
    rate never leaves its ramp; a budget that fits more says nothing."""
    def budget_run(warmup: str, out: str):
        return run("train", "--backend", "numpy_ref", "--data", str(names_file), "--d-model", "16", "--time-budget",
                   "0.3", "--warmup-steps", warmup, "--log-every", "1000000", "--out", str(tmp_path / out))

    short = budget_run("1000000", "short")
    assert short.exit_code == 0, short.output
    total = int(re.search(r"training for ([\d,]+) steps \(fit to a 0.3 s budget\)", short.stdout)[1].replace(",", ""))
    assert 0 < total < 1_000_000
    assert (f"warning: the 0.3 s budget fits about {total:,} steps, no more than warmup_steps (1,000,000): the "
            "learning rate ramps up for the whole run and never decays; lower warmup_steps or raise time_budget"
            in short.stdout)
    long = budget_run("1", "long")
    assert long.exit_code == 0, long.output
    assert "warning" not in long.stdout
