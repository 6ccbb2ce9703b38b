"""`eemicrogpt sample`'s work once its options are read: names or text continuations, by the checkpoint's kind,
streamed to the terminal as they are drawn or written to a new file that appears whole."""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ..base.atomic import created_file
from ..base.errors import ConfigError, StorageError, describe_os_error
from ..base.reading import open_regular
from ..data.names import clean_prefix
from ..model.choice import Choice
from ..model.sampling import (
    MAX_PROMPT_CHARS,
    NAMES_TEMPERATURE,
    TEXT_TEMPERATURE,
    default_prompt,
    sample_names,
    text_continuations,
)
from ..training.checkpoint import Checkpoint

NAMES_N, TEXT_N = 20, 1  # -n by default: names, and continuations of a text
DEFAULT_NEW_TOKENS = 500
SEPARATOR = "-" * 15  # between continuations when -n asks for several, as nanoGPT prints them
PROMPT_FILE_BYTES = 4 * MAX_PROMPT_CHARS  # UTF-8 takes at most 4 bytes a character


@dataclass
class SampleOptions:
    n: int | None = None
    temperature: float | None = None
    seed: int | None = None
    top_k: int | None = None
    top_p: float | None = None
    prefix: str | None = None  # lists only
    max_len: int | None = None
    unique: bool = False
    prompt: str | None = None  # texts only
    prompt_file: Path | None = None
    max_new_tokens: int | None = None
    slide: int | None = None


def read_prompt_file(path: Path) -> str:
    """The prompt file's text, read up to its bound. It must be a regular file, as every file given by path
    is: a FIFO without a writer would block the read forever, a device never ends."""
    try:
        with os.fdopen(open_regular(path, "prompt file", ConfigError), "rb") as f:
            data = f.read(PROMPT_FILE_BYTES + 1)
    except FileNotFoundError:  # not "a parent folder is missing", the advice for a file being written
        raise ConfigError(f"prompt file not found: {path}") from None
    except OSError as e:
        raise ConfigError(describe_os_error(e, "cannot read --prompt-file")) from None
    if len(data) > PROMPT_FILE_BYTES:
        raise ConfigError(f"--prompt-file {path} is larger than {PROMPT_FILE_BYTES:,} bytes; a prompt is read "
                          f"up to {MAX_PROMPT_CHARS:,} characters")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"--prompt-file {path} is not UTF-8 (byte {e.start})") from None


def _refuse(given: dict[str, bool], kind: str, instead: str) -> None:
    flags = [flag for flag, on in given.items() if on]
    if flags:
        raise ConfigError(f"{', '.join(flags)} {'is' if len(flags) == 1 else 'are'} not for this run: it was "
                          f"trained on {kind}; {instead}")


def sample_lines(ckpt: Checkpoint, opts: SampleOptions) -> Iterable[str]:
    """What `sample` prints, in pieces as they are ready (checked before the first piece is made)."""
    params, shape, vocab = ckpt.state.params, ckpt.shape, ckpt.vocab
    if vocab.with_boundary:
        _refuse({"--prompt": opts.prompt is not None, "--prompt-file": opts.prompt_file is not None,
                 "--max-new-tokens": opts.max_new_tokens is not None, "--slide": opts.slide is not None},
                "a list of names", "use --prefix")
        choice = Choice(NAMES_TEMPERATURE if opts.temperature is None else opts.temperature, opts.top_k, opts.top_p)
        names = sample_names(params, shape, vocab, NAMES_N if opts.n is None else opts.n, choice, opts.seed,
                             prefix=clean_prefix(opts.prefix or "", ckpt.config.lowercase), max_len=opts.max_len,
                             unique=opts.unique)
        return (f"{name}\n" for name in names)
    _refuse({"--prefix": opts.prefix is not None, "--max-len": opts.max_len is not None, "--unique": opts.unique},
            "a text", "use --prompt and --max-new-tokens")
    if opts.prompt_file is not None:
        prompt = read_prompt_file(opts.prompt_file)
    else:
        prompt = default_prompt(vocab) if opts.prompt is None else opts.prompt
    prompt = unicodedata.normalize("NFC", prompt)  # the text was read as NFC
    choice = Choice(TEXT_TEMPERATURE if opts.temperature is None else opts.temperature, opts.top_k, opts.top_p)
    n = TEXT_N if opts.n is None else opts.n
    new = DEFAULT_NEW_TOKENS if opts.max_new_tokens is None else opts.max_new_tokens
    texts = text_continuations(params, shape, vocab, prompt, new, n, choice, opts.seed, opts.slide)
    return _joined(prompt, texts, n)


def _joined(prompt: str, texts: Iterable[Iterable[str]], n: int) -> Iterable[str]:
    for i, chars in enumerate(texts):
        yield prompt
        yield from chars
        yield "\n" if i + 1 == n else f"\n{SEPARATOR}\n"


def stream(pieces: Iterable[str], out: TextIO) -> None:
    """Print pieces as they come: flushed each time on a terminal, buffered into a pipe or file."""
    flush = out.isatty() if hasattr(out, "isatty") else False
    try:
        for piece in pieces:
            out.write(piece)
            if flush:
                out.flush()
    except UnicodeEncodeError as e:
        raise ConfigError(f"the output's encoding ({e.encoding}) cannot show {e.object[e.start:e.end]!r}: set "
                          "PYTHONIOENCODING=utf-8, or write a UTF-8 file with --out") from None
    out.flush()


def write_new(pieces: Iterable[str], target: Path) -> tuple[int, int]:
    """Write pieces to target, a new file that appears complete or not at all: the pieces and characters
    written (a names run's pieces are its names)."""
    count = chars = 0
    try:
        with created_file(target) as f:
            for piece in pieces:
                f.write(piece.encode("utf-8"))
                count, chars = count + 1, chars + len(piece)
    except FileExistsError:
        raise ConfigError(f"--out {target} already exists; choose a new file (samples never overwrite one)") \
            from None
    except OSError as e:
        raise StorageError(describe_os_error(e, "cannot write the samples")) from None
    return count, chars
