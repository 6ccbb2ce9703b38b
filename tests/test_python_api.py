"""The Python API (package eemicrogpt): docs/python-api.md's examples run as written, and the API's own rules."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import eemicrogpt
from eemicrogpt_core.kit.conformance import names_file

DOC = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EEMICROGPT_DATA", str(names_file()))
    monkeypatch.setenv("EEMICROGPT_BACKEND", "numpy_ref")  # the same on every CPU
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_documented_examples_run(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) >= 4
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
    out = capsys.readouterr().out
    assert "refused: " in out and "val loss" in out
    assert (workdir / "model.safetensors").is_file()


def test_train_returns_the_run_it_wrote(workdir: Path) -> None:
    run = eemicrogpt.train(d_model=16, steps=40, log_every=20, out="r1", progress=False)
    assert run.run_dir == Path("r1") and (workdir / "r1" / "checkpoint.npz").is_file()
    assert run.step == 40 and run.losses is not None and run.losses.shape == (40,)
    assert [m["step"] for m in run.metrics] == [20, 40]
    loaded = eemicrogpt.load("r1")
    assert np.array_equal(loaded.params, run.params) and loaded.vocab == run.vocab
    assert loaded.metrics == run.metrics


def test_keys_override_the_config_file(workdir: Path) -> None:
    (workdir / "c.yaml").write_text("d_model: 32\nsteps: 10\nlog_every: 5\n")
    run = eemicrogpt.train("c.yaml", d_model=16, out="r2", progress=False)
    assert run.shape.d_model == 16 and run.total_steps == 10


def test_errors_are_one_family(workdir: Path) -> None:
    with pytest.raises(eemicrogpt.ConfigError):
        eemicrogpt.train(d_mdoel=16, progress=False)
    with pytest.raises(eemicrogpt.EemicrogptError):
        eemicrogpt.load(workdir / "missing")
    with pytest.raises(eemicrogpt.DataError, match="not found"):
        eemicrogpt.train(data="no-such-names.txt", progress=False)
    assert not (workdir / "runs").exists()  # nothing is created before the inputs are checked


def test_repr_is_one_short_line(workdir: Path) -> None:
    run = eemicrogpt.train(d_model=16, steps=20, log_every=20, out="r3", progress=False)
    text = repr(run)
    assert text.startswith("Run(d16, 4 heads, 1 layer, vocab 27, context 16, step 20/20, val loss ")
    assert text.endswith(", 'r3')") and "\n" not in text and len(text) < 120
    assert len(run.sample()) == 20  # the CLI's `sample -n` default too


def test_data_from_a_list_is_kept_in_the_run_directory(workdir: Path) -> None:
    from eemicrogpt_core.backends.registry import load_registry
    from eemicrogpt_core.training import runs

    items = ["anna", "bob", "carla", "dmitri", "eve", "fatima", "gus", "hana"] * 3
    run = eemicrogpt.train(data=items, d_model=16, steps=20, log_every=10, out="mem", progress=False)
    kept = workdir / "mem" / "data.txt"
    assert kept.read_text(encoding="utf-8").splitlines() == items
    assert run.config.data == str(Path("mem") / "data.txt") and run.vocab.symbols == tuple(sorted(set("".join(items))))
    plan = runs.plan_resume(load_registry(), "mem", extend_to=30)  # the data file is found and fingerprinted
    assert isinstance(plan, runs.RunPlan) and int(runs.execute(plan, load_registry()).state.step) == 30


@pytest.mark.parametrize(("items", "message"), [
    ([], "the list of items is empty"),
    (["anna", 7], "item 1 is int 7, not a string"),
    (["anna", "bo\nb"], "item 1 ('bo\\nb') is blank or holds a line break"),
    (["anna", "  "], "is blank or holds a line break"),
])
def test_bad_lists_are_refused_before_anything_is_written(workdir: Path, items: list[object], message: str) -> None:
    with pytest.raises(eemicrogpt.DataError, match=re.escape(message)):
        eemicrogpt.train(data=items, d_model=16, steps=10, out="bad", progress=False)
    assert not (workdir / "bad").exists()


def test_train_keys_mirror_the_config_schema() -> None:
    """TrainKeys (what an editor completes for train(**keys)) has every config key but data and backend, each
    typed as the schema types it; a key with choices lists them."""
    import typing

    from eemicrogpt_core.interface.train_keys import TrainKeys
    from eemicrogpt_core.training.config import FIELD_TYPES, SETTINGS

    hints = typing.get_type_hints(TrainKeys)
    assert list(hints) == [k for k in FIELD_TYPES if k not in ("data", "backend")]

    def flat(hint: object) -> tuple[object, ...]:
        args = typing.get_args(hint)
        if typing.get_origin(hint) is typing.Literal:
            return args
        return tuple(a for arg in args for a in flat(arg)) if args else (hint,)

    for key, hint in hints.items():
        parts = flat(hint)
        words = {p for p in parts if isinstance(p, str)}
        types = {p for p in parts if not isinstance(p, str)} | ({str} if words else set())
        setting = SETTINGS[key]
        assert types == set(FIELD_TYPES[key]) | ({str} if setting.null_word else set()), key  # threads: "auto"
        expected_words = set(setting.choices or ()) | ({setting.null_word} if setting.null_word else set())
        if words or expected_words:
            assert words == expected_words, key
