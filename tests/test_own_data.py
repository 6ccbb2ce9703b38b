"""`eemicrogpt train` and `sample` end to end (typer's CliRunner, numpy_ref) on datasets of the kinds people
bring, each written here: city names with spaces and "st. louis", accented names, Pokémon-like names with
'♀' and digits, a file of one name; plus depth and context from a config, no validation split, a resume on
a file with a character outside the checkpoint's table, and a format-2 run directory resumed exactly."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_errors import one_line_error
from legacy_checkpoint import read_meta, rewrite_run_as_format_2
from typer.testing import CliRunner

from eemicrogpt_core.backends.registry import load_registry
from eemicrogpt_core.interface import cli
from eemicrogpt_core.model.vocab import Vocabulary
from eemicrogpt_core.training.checkpoint import load_checkpoint
from eemicrogpt_core.training.rundir import RunDir
from eemicrogpt_core.training.trainer import NullReporter, train

RUNNER = CliRunner()
TINY = ["--backend", "numpy_ref", "--d-model", "16", "--steps", "30", "--log-every", "15", "--lr", "0.01"]

DATASETS: dict[str, list[str]] = {
    "cities": ["new york", "los angeles", "st. louis", "san josé", "winston-salem", "salt lake city", "el paso",
               "fort worth", "o'fallon", "coeur d'alene", "saint-étienne", "baton rouge"],
    "accents": ["josé", "zoë", "chloé", "björn", "søren", "añaterve", "françois", "łukasz", "māui", "straße", "Ana",
                "Ève"],
    "pokemon": ["nidoran♀", "nidoran♂", "farfetch'd", "mr. mime", "porygon-z", "porygon2", "ho-oh", "flabébé",
                "type: null", "jangmo-o", "mime jr.", "sirfetch'd"],
    "digits": ["r2d2", "c3po", "agent 007", "route 66", "apollo 11", "bb8", "k9", "ig-88", "area 51", "b2b"],
    "one name": ["Zoë-Lou"],
}


def run(*args: str) -> Any:
    return RUNNER.invoke(cli.app, list(args), env={"EEMICROGPT_BACKEND": None, "EEMICROGPT_DATA": None})


def write_names(path: Path, names: list[str]) -> Path:
    path.write_text("".join(f"{n}\n" for n in names), encoding="utf-8")
    return path


def vocabulary_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("vocabulary "))


def sampled(result: Any) -> list[str]:
    assert result.exit_code == 0, result.output
    return result.stdout.split("\n")[:-1]  # one name per line; names may hold spaces


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, Any]]:
    """Every dataset trained for 30 steps: name -> (names file, run directory, the CLI result)."""
    work = tmp_path_factory.mktemp("own")
    runs = {}
    for i, (kind, names) in enumerate(DATASETS.items()):
        data = write_names(work / f"names{i}.txt", names)
        out = work / f"run{i}"
        runs[kind] = (data, out, run("train", *TINY, "--data", str(data), "--out", str(out)))
    return runs


@pytest.mark.parametrize("kind", list(DATASETS))
def test_each_dataset_trains_and_the_start_line_shows_its_vocabulary(
        kind: str, trained: dict[str, tuple[Path, Path, Any]]) -> None:
    _, out, result = trained[kind]
    assert result.exit_code == 0, result.output
    symbols = sorted(set("".join(DATASETS[kind])))
    vocab = Vocabulary(tuple(symbols))
    line = vocabulary_line(result.stdout)
    assert line == f"vocabulary {vocab.describe()}"
    assert line.startswith(f"vocabulary {len(symbols) + 1} tokens: ")
    for ch in symbols:  # every symbol is shown (a space as ␠)
        assert (ch if ch != " " else "␠") in line, ch
    assert "step 30/30" in result.stdout
    ckpt = load_checkpoint(out / "checkpoint.npz")
    assert ckpt.vocab == vocab and ckpt.shape.vocab == len(symbols) + 1
    assert read_meta(out / "checkpoint.npz")["symbols"] == symbols


@pytest.mark.parametrize("kind", ["cities", "accents", "pokemon", "digits"])
def test_samples_use_the_datasets_characters(kind: str, trained: dict[str, tuple[Path, Path, Any]]) -> None:
    _, out, _ = trained[kind]
    names = sampled(run("sample", str(out), "-n", "40", "--temperature", "1.5", "--seed", "2"))
    allowed = set("".join(DATASETS[kind]))
    assert len(names) == 40 and all(set(n) <= allowed for n in names)
    used = set("".join(names))
    special = {"cities": " .-'é", "accents": "éëöøñçłāßAÈÉ", "pokemon": "♀♂'. -2:é", "digits": "0123456789 -"}[kind]
    assert used & set(special), (kind, names)  # the characters beyond a-z come out too
    assert max(len(n) for n in names) <= 16


def test_one_name_file_trains_and_says_how_it_validates(trained: dict[str, tuple[Path, Path, Any]]) -> None:
    _, out, result = trained["one name"]
    assert "1 train / 1 validation names" in result.stdout
    note = next(line for line in result.stdout.splitlines() if line.startswith("note: "))
    assert "too few" in note and "validation loss is measured on the training names" in note
    records = RunDir.existing(out).read_metrics()
    assert [r["step"] for r in records] == [15, 30] and all(np.isfinite(r["val_loss"]) for r in records)


def test_sample_options_on_an_accented_run(trained: dict[str, tuple[Path, Path, Any]], tmp_path: Path) -> None:
    _, out, _ = trained["accents"]
    # a decomposed é in the prefix is the composed symbol the vocabulary holds
    names = sampled(run("sample", str(out), "-n", "12", "--temperature", "1.0", "--prefix", "jose\u0301"))
    assert len(names) == 12 and all(n.startswith("jos\u00e9") for n in names)
    short = sampled(run("sample", str(out), "-n", "30", "--temperature", "1.5", "--max-len", "3"))
    assert all(len(n) <= 3 for n in short)
    greedy = sampled(run("sample", str(out), "-n", "3", "--temperature", "0", "--seed", "1"))
    assert len(set(greedy)) == 1 and greedy == sampled(run("sample", str(out), "-n", "3", "--temperature", "0"))
    distinct = sampled(run("sample", str(out), "-n", "15", "--temperature", "1.5", "--unique"))
    assert len(distinct) == len(set(distinct)) == 15
    target = tmp_path / "names.txt"
    result = run("sample", str(out), "-n", "5", "--out", str(target))
    assert result.exit_code == 0 and f"wrote 5 names to {target}" in result.stdout
    assert len(target.read_text(encoding="utf-8").split("\n")) == 6
    before = target.read_bytes()
    one_line_error(run("sample", str(out), "--out", str(target)), "already exists")
    assert target.read_bytes() == before


def test_depth_context_and_lowercase_from_a_config(tmp_path: Path) -> None:
    data = write_names(tmp_path / "cities.txt", [n.title() for n in DATASETS["cities"]] + ["Llanfairpwllgwyngyll"])
    config = tmp_path / "deep.yaml"
    config.write_text("n_layers: 2\ncontext: 12\nlowercase: true\n")
    out = tmp_path / "run"
    result = run("train", "--config", str(config), *TINY, "--data", str(data), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "d16, 4 heads, 2 layers, vocab" in result.stdout and "context 12" in result.stdout
    long_names = sum(len(n) >= 12 for n in [*DATASETS["cities"], "llanfairpwllgwyngyll"])
    assert f"{long_names} longer than the context (12) truncated" in result.stdout
    ckpt = load_checkpoint(out / "checkpoint.npz")
    assert ckpt.shape.n_layers == 2 and ckpt.shape.context == 12 and ckpt.config.lowercase
    assert not any(ch.isupper() for ch in ckpt.vocab.symbols)
    names = sampled(run("sample", str(out), "-n", "20", "--temperature", "1.5"))
    assert max(len(n) for n in names) <= 12 and all(set(n) <= set(ckpt.vocab.symbols) for n in names)


def test_val_fraction_zero_trains_without_validation(tmp_path: Path) -> None:
    data = write_names(tmp_path / "pokemon.txt", DATASETS["pokemon"])
    config = tmp_path / "noval.yaml"
    config.write_text("val_fraction: 0\n")
    out = tmp_path / "run"
    result = run("train", "--config", str(config), *TINY, "--data", str(data), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert f"{len(DATASETS['pokemon'])} train / 0 validation names" in result.stdout
    assert "note: no validation split (val_fraction 0)" in result.stdout
    assert "val loss -" in result.stdout  # the summary has no validation loss to give
    assert [r["val_loss"] for r in RunDir.existing(out).read_metrics()] == [None, None]


def test_resume_on_a_character_outside_the_table_is_one_line(trained: dict[str, tuple[Path, Path, Any]],
                                                             tmp_path: Path) -> None:
    _, out, _ = trained["cities"]
    cfg = dataclasses.replace(load_checkpoint(out / "checkpoint.npz").config, steps=40, log_every=10,
                              out=str(tmp_path / "run"))
    assert train(cfg, load_registry(), run_dir=RunDir.create(cfg.out, cfg), reporter=_StopAt20()).interrupted
    before = (tmp_path / "run" / "checkpoint.npz").read_bytes()
    more = write_names(tmp_path / "more.txt", [*DATASETS["cities"], "münchen"])
    for extra in ((), ("--allow-data-change",)):  # the character is named whether or not a change is allowed
        one_line_error(run("train", "--resume", cfg.out, "--data", str(more), *extra),
                       "more.txt:13: character 'ü'", "not in the checkpoint's vocabulary")
    assert (tmp_path / "run" / "checkpoint.npz").read_bytes() == before  # nothing of the run changed


class _StopAt20(NullReporter):
    def progress(self, step: int, total: int, train_loss: float) -> None:
        if step >= 20:
            raise KeyboardInterrupt


def _resume_format_2(names_file: Path, tmp_path: Path, extra_config: str) -> tuple[Any, Path, Path]:
    """A context-15 run of 40 steps, and the same run stopped at 20, turned into a format-2 run directory and
    resumed from the command line."""
    config = tmp_path / "legacy.yaml"
    config.write_text(f"context: 15\n{extra_config}")
    full = tmp_path / "full"
    args = ("--backend", "numpy_ref", "--data", str(names_file), "--d-model", "16", "--log-every", "20")
    done = run("train", "--config", str(config), *args, "--steps", "40", "--out", str(full))
    assert done.exit_code == 0, done.output
    cfg = dataclasses.replace(load_checkpoint(full / "checkpoint.npz").config, out=str(tmp_path / "half"))
    stopped = train(cfg, load_registry(), run_dir=RunDir.create(cfg.out, cfg), reporter=_StopAt20())
    assert stopped.interrupted and stopped.steps_run == 20
    half = Path(cfg.out)
    rewrite_run_as_format_2(half)
    assert read_meta(half / "checkpoint.npz")["version"] == 2
    return run("train", "--resume", str(half)), full, half


def test_a_format_2_run_resumes_exactly(names_file: Path, tmp_path: Path) -> None:
    result, full, half = _resume_format_2(names_file, tmp_path, "")
    assert result.exit_code == 0, result.output
    assert "resuming at step 20 of 40" in result.stdout and "vocabulary 27 tokens: a-z" in result.stdout
    assert "context 15" in result.stdout and "saved by eemicrogpt 0.1.0" in result.stdout
    resumed, uninterrupted = load_checkpoint(half / "checkpoint.npz"), load_checkpoint(full / "checkpoint.npz")
    assert read_meta(half / "checkpoint.npz")["version"] == 3 and resumed.vocab == Vocabulary.names()
    assert resumed.state.step == 40 and resumed.shape == uninterrupted.shape
    assert np.array_equal(resumed.state.params, uninterrupted.state.params)


def test_a_format_2_run_on_capitalised_names_resumes(names_file: Path, tmp_path: Path) -> None:
    """Formats 1-2 folded case before checking a-z: a names file with capitals trained, and still resumes."""
    capitals = write_names(tmp_path / "Names.txt", [n.capitalize() for n in
                                                    names_file.read_text().split()[:2000]])
    result, full, half = _resume_format_2(capitals, tmp_path, "lowercase: true\n")
    assert result.exit_code == 0, result.output
    assert np.array_equal(load_checkpoint(half / "checkpoint.npz").state.params,
                          load_checkpoint(full / "checkpoint.npz").state.params)


def test_shape_flags_on_the_command_line(tmp_path: Path) -> None:
    data = write_names(tmp_path / "cities.txt", [n.title() for n in DATASETS["cities"]])
    result = run("train", *TINY, "--data", str(data), "--out", str(tmp_path / "run"), "--n-layers", "2",
                 "--context", "12", "--lowercase", "--val-fraction", "0")
    assert result.exit_code == 0, result.output
    assert "2 layers" in result.stdout and "context 12" in result.stdout and "0 validation names" in result.stdout
