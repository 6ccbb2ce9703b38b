"""The command line's options for the config keys, derived from the schema (config.SETTINGS and FIELD_TYPES).

`with_config_options` gives a typer command one option per key: `--key-with-dashes` (or the key's
`Setting.flag`), `--key/--no-key` for true-or-false keys, the key's help text, and a key's `Setting.switch`
as a flag of its own (`--text` for `--data-format text`). None means "not given", so a
flag overrides the config file only when it is on the command line. A key whose null has a word (`threads:
auto`) takes that word on the command line too: the option passes it on as given, and the config layer reads
it as null, like the same word in a YAML file.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from ..base.errors import ConfigError
from ..training.config import FIELD_TYPES, SETTINGS, TYPE_WORDS

OVERRIDES = "overrides"  # the parameter through which the command receives the keys' values


def flag_of(key: str) -> str:
    """The option that sets key on the command line."""
    return SETTINGS[key].flag or "--" + key.replace("_", "-")


def flags_of(key: str) -> str:
    """Every option that sets key, for messages about a value given on the command line (--data-format/--text)."""
    switch = SETTINGS[key].switch
    return flag_of(key) + (f"/{switch[0]}" if switch is not None else "")


def _value_or_word(value_type: type, word: str) -> Callable[[str], Any]:
    """A command-line parser for a value of `value_type` or `word`, passed through as written (the key's null)."""

    def parse(text: str) -> Any:
        if text == word:
            return text
        try:
            return value_type(text)
        except ValueError:
            raise typer.BadParameter(f"{text!r} is neither {TYPE_WORDS[value_type]} nor {word!r}") from None

    return parse


def _option(key: str) -> inspect.Parameter:
    value_type = next(t for t in FIELD_TYPES[key] if t is not type(None))
    setting = SETTINGS[key]
    flag = flag_of(key)
    decls = [f"{flag}/--no-{flag.removeprefix('--')}"] if value_type is bool else [flag]
    if setting.null_word is not None:
        option = typer.Option(*decls, help=setting.help, show_default=False, metavar=f"<{setting.null_word}|N>",
                              parser=_value_or_word(value_type, setting.null_word))
        annotation: Any = Annotated[str | None, option]
    else:
        option = typer.Option(*decls, help=setting.help, show_default=False)
        annotation = Annotated[value_type | None, option]
    return inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)


def _switch_name(key: str) -> str:
    return f"{key}__switch"  # a parameter name no config key can have (keys have no double underscore)


def _switch(key: str, flag: str, value: str) -> inspect.Parameter:
    option = typer.Option(flag, help=f"shorthand for {flag_of(key)} {value}", show_default=False)
    return inspect.Parameter(_switch_name(key), inspect.Parameter.KEYWORD_ONLY, default=False,
                             annotation=Annotated[bool, option])


def _apply_switch(key: str, given: Any, switched: bool) -> Any:
    """The key's value once its switch is applied: a switch and a different explicit value clash."""
    switch = SETTINGS[key].switch
    if not switched or switch is None:
        return given
    flag, value = switch
    if given is not None and given != value:
        raise ConfigError(f"{flag} and {flag_of(key)} {given} contradict each other; give one")
    return value


def with_config_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add an option per config key to a typer command after its own parameters; the command gets their values as
    `overrides: dict[str, Any]` (every key, None when not given)."""
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != OVERRIDES]
    keys = list(SETTINGS)
    clash = {p.name for p in own} & set(keys)
    if clash:
        raise TypeError(f"{command.__name__} has parameters named like config keys: {', '.join(sorted(clash))}")
    switches = {key: s.switch for key, s in SETTINGS.items() if s.switch is not None}
    params = own + [_option(key) for key in keys] + [_switch(key, *switch) for key, switch in switches.items()]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        switched = {key: kwargs.pop(_switch_name(key)) for key in switches}
        overrides = {key: _apply_switch(key, kwargs.pop(key), switched.get(key, False)) for key in keys}
        return command(**kwargs, **{OVERRIDES: overrides})

    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper
