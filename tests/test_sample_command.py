"""`eemicrogpt sample` end to end: names with top-k/top-p, text continuations of a prompt (a text checkpoint is
made by giving a trained model a vocabulary of the same size without a boundary), streaming, `--out` as a
new file that appears whole, and every bad input as one line with exit status 2."""

from __future__ import annotations

import dataclasses
import errno
import io
import os
import string
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eemicrogpt_core.base.errors import ConfigError
from eemicrogpt_core.interface import cli, sample_output
from eemicrogpt_core.interface.api import load
from eemicrogpt_core.model.vocab import Vocabulary
from eemicrogpt_core.training.checkpoint import Checkpoint, load_checkpoint
from eemicrogpt_core.training.config import TrainConfig
from eemicrogpt_core.training.rundir import RunDir
from eemicrogpt_core.training.trainer import NullReporter, train

RUNNER = CliRunner()
TEXT = Vocabulary(("\n", *string.ascii_lowercase), with_boundary=False)  # 27 tokens, as the names model has


def run(*args: str):
    return RUNNER.invoke(cli.app, list(args), env={"EEMICROGPT_BACKEND": None, "EEMICROGPT_DATA": None})


def assert_one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("eemicrogpt: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def names_run(names_file: Path, registry, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = TrainConfig(d_model=16, steps=200, lr=0.01, backend="numpy_ref", data=str(names_file), log_every=100,
                      eval_batches=2, out=str(tmp_path_factory.mktemp("sample") / "run"))
    run_dir = RunDir.create(cfg.out, cfg)
    train(cfg, registry, run_dir=run_dir, reporter=NullReporter())
    return run_dir.path


@pytest.fixture
def text_run(names_run: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The same run read as a text model: newline and a-z, no boundary."""

    def as_text(path: Path) -> Checkpoint:
        return dataclasses.replace(load_checkpoint(path), vocab=TEXT)

    monkeypatch.setattr(cli, "load_checkpoint", as_text)
    return names_run


def test_names_take_top_k_and_top_p(names_run: Path) -> None:
    args = ("sample", str(names_run), "-n", "30", "--temperature", "1.5", "--seed", "4")
    loose = run(*args)
    cut = run(*args, "--top-k", "3", "--top-p", "0.9")
    assert loose.exit_code == 0 and cut.exit_code == 0, cut.output
    assert len(cut.stdout.splitlines()) == 30 and cut.stdout == run(*args, "--top-k", "3", "--top-p", "0.9").stdout
    # at temperature 1.5 the three-token cut uses fewer distinct letters than the whole distribution
    assert len(set(cut.stdout) - {"\n"}) < len(set(loose.stdout) - {"\n"})


def test_names_are_fresh_without_a_seed_and_a_tiny_temperature_is_greedy(names_run: Path) -> None:
    a, b = run("sample", str(names_run), "--temperature", "1"), run("sample", str(names_run), "--temperature", "1")
    assert a.exit_code == 0 and a.stdout != b.stdout
    tiny = run("sample", str(names_run), "-n", "3", "--temperature", "5e-324")
    assert tiny.exit_code == 0 and tiny.stderr == ""  # no overflow warnings
    assert tiny.stdout == run("sample", str(names_run), "-n", "3", "--temperature", "0").stdout


def test_text_continues_a_prompt_as_the_api_does(text_run: Path) -> None:
    result = run("sample", str(text_run), "--prompt", "emma\n", "--max-new-tokens", "100", "--seed", "2",
                 "--top-k", "10")
    assert result.exit_code == 0, result.output
    api_run = dataclasses.replace(load(text_run), vocab=TEXT)
    continuation = api_run.generate("emma\n", max_new_tokens=100, temperature=0.8, top_k=10, seed=2)
    assert result.stdout == "emma\n" + continuation + "\n"
    assert len(continuation) == 100 and continuation.count("\n") >= 5  # a names model writes one name a line


def test_text_defaults_and_several_continuations(text_run: Path, tmp_path: Path) -> None:
    result = run("sample", str(text_run), "--seed", "1")
    assert result.exit_code == 0 and len(result.stdout) == 1 + 500 + 1  # the default prompt is the newline
    three = run("sample", str(text_run), "-n", "3", "--prompt", "a", "--max-new-tokens", "40", "--seed", "1")
    parts = three.stdout.split(f"\n{sample_output.SEPARATOR}\n")
    assert len(parts) == 3 and all(len(p.rstrip("\n")) == 41 and p.startswith("a") for p in parts[:2])
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("olivia\nava\n")
    from_file = run("sample", str(text_run), "--prompt-file", str(prompt), "--max-new-tokens", "20")
    assert from_file.exit_code == 0 and from_file.stdout.startswith("olivia\nava\n")
    out = tmp_path / "more.txt"
    written = run("sample", str(text_run), "--prompt", "ab", "--max-new-tokens", "30", "--seed", "3", "--out", str(out))
    assert written.stdout == f"wrote 33 characters to {out}\n"  # the prompt, 30 characters and the newline
    assert out.read_text() == run("sample", str(text_run), "--prompt", "ab", "--max-new-tokens", "30", "--seed",
                                  "3").stdout


@pytest.mark.parametrize(("args", "fragment"), [
    (["--prompt", "Emma"], "the prompt's character 'E' (U+0045) is not in the model's vocabulary"),
    (["--prompt", ""], "the prompt is empty"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be in 1..1,000,000, got 0"),
    (["--max-new-tokens", "1000000000"], "--max-new-tokens must be in 1..1,000,000"),
    (["--top-k", "0"], "--top-k must be >= 1"),
    (["--top-k", "28"], "top-k must be 1..27 (the model's vocabulary), got 28"),
    (["--prefix", "a"], "--prefix is not for this run: it was trained on a text; use --prompt"),
    (["--unique", "--max-len", "4"], "--max-len, --unique are not for this run"),
    (["--prompt", "a", "--prompt-file", "p.txt"], "give --prompt or --prompt-file, not both"),
    (["--prompt-file", "/nonexistent/p.txt"], "prompt file not found: /nonexistent/p.txt"),
    (["--seed", "-1"], "--seed must be >= 0, got -1"),
    (["--slide", "17"], "slide must be 1..16 (the model's context), got 17"),
])
def test_text_bad_inputs_are_one_line(text_run: Path, args: list[str], fragment: str) -> None:
    assert_one_line_error(run("sample", str(text_run), *args), fragment)


def test_a_prompt_file_that_is_not_utf8_or_too_big(text_run: Path, tmp_path: Path) -> None:
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf\xe9")
    assert_one_line_error(run("sample", str(text_run), "--prompt-file", str(bad)), "is not UTF-8 (byte 3)")
    big = tmp_path / "big.txt"
    big.write_bytes(b"a" * (sample_output.PROMPT_FILE_BYTES + 1))
    assert_one_line_error(run("sample", str(text_run), "--prompt-file", str(big)), "is larger than 4,000,000 bytes")


def test_text_options_on_a_names_run_are_refused(names_run: Path) -> None:
    assert_one_line_error(run("sample", str(names_run), "--slide", "4", "--max-new-tokens", "9"),
                          "--max-new-tokens, --slide are not for this run: it was trained on a list of names")


def test_out_is_a_new_file_and_never_replaces_one(names_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "names.txt"
    result = run("sample", str(names_run), "-n", "5", "--seed", "1", "--out", str(out))
    assert result.exit_code == 0 and f"wrote 5 names to {out}" in result.stdout
    assert out.read_text() == run("sample", str(names_run), "-n", "5", "--seed", "1").stdout
    assert_one_line_error(run("sample", str(names_run), "--out", str(out)), "already exists")
    mine = tmp_path / "mine.txt"
    mine.write_text("keep me")
    link = tmp_path / "link.txt"
    link.symlink_to(mine)
    assert_one_line_error(run("sample", str(names_run), "--out", str(link)), "already exists")
    dangling = tmp_path / "dangling.txt"
    dangling.symlink_to(tmp_path / "nowhere.txt")
    assert_one_line_error(run("sample", str(names_run), "--out", str(dangling)), "already exists")
    assert mine.read_text() == "keep me" and not (tmp_path / "nowhere.txt").exists()
    missing = tmp_path / "no-such-folder" / "names.txt"
    assert_one_line_error(run("sample", str(names_run), "--out", str(missing)),
                          f"cannot write the samples {missing}: No such file or directory")


def test_a_failed_write_leaves_no_file(names_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def disk_fills(ckpt: Checkpoint, opts: sample_output.SampleOptions) -> Iterator[str]:
        yield "emma\n"
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(cli, "sample_lines", disk_fills)
    out = tmp_path / "names.txt"
    assert_one_line_error(run("sample", str(names_run), "--out", str(out)),
                          f"cannot write the samples {out}: No space left on device; free some disk space")
    assert list(tmp_path.iterdir()) == []  # neither the file nor its temporary one


class Terminal(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.flushed: list[str] = []

    def isatty(self) -> bool:
        return True

    def flush(self) -> None:
        self.flushed.append(self.getvalue())


def test_a_terminal_sees_each_piece_as_it_comes() -> None:
    term = Terminal()
    sample_output.stream(iter("abc"), term)
    assert term.flushed[:3] == ["a", "ab", "abc"]
    piped = io.StringIO()
    sample_output.stream(iter("abc"), piped)
    assert piped.getvalue() == "abc"


def test_an_output_encoding_without_the_characters_is_one_error() -> None:
    ascii_out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    with pytest.raises(ConfigError, match=r"the output's encoding \(ascii\) cannot show 'é': set PYTHONIOENCODING"):
        sample_output.stream(iter(["zoe\n", "zoé\n"]), ascii_out)
