"""One line per bad file: `ConfigError`, and msgspec's shape errors said as a config
author would say them (`config.yaml: resources[0].count: expected an integer, got a
string`). Every block's meaning check reports through a `Fail`."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NoReturn, TypeVar

import msgspec

_T = TypeVar("_T")

# fail(field, problem) raises: the meaning checks of every block take one.
Fail = Callable[[str, str], NoReturn]


class ConfigError(Exception):
    """A config file that cannot be used; the message is one line."""


def convert(data: object, schema: type[_T], source: str) -> _T:
    """`data` (parsed YAML) as a `schema` struct, or a ConfigError naming the file,
    the field and the problem: the shape check of every devplug file."""
    try:
        return msgspec.convert(data, schema)
    except msgspec.ValidationError as e:
        raise ConfigError(shape_message(source, str(e))) from None


def one_line(text: str) -> str:
    return " ".join(text.split())


def int_problem(value: int, low: int, high: int) -> str | None:
    if value < low:
        return f"expected an integer >= {low}, got {value}"
    if value > high:
        return f"expected an integer <= {high}, got {value}"
    return None


# msgspec's type names, as a config author would say them.
_TYPES = {
    "object": "a mapping",
    "array": "a list",
    "array | null": "a list",
    "str": "a string",
    "int": "an integer",
    "int | null": "an integer",
    "bool": "true or false",
    "float": "a number",
    "null": "nothing (null)",
    "str | array | null": 'a string or a list (quote hex IDs: "0403")',
}
_AT = re.compile(r"^(?P<problem>.*) - at `(?P<path>[^`]*)`$", re.DOTALL)
_AT_KEY = re.compile(r"^(?P<problem>.*) - at `key` in `(?P<path>[^`]*)`$", re.DOTALL)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<field>.*)`$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<field>.*)`$", re.DOTALL)
_EXPECTED = re.compile(r"^Expected `(?P<want>[^`]*)`(?:, got `(?P<got>[^`]*)`)?$")


def shape_message(source: str, message: str) -> str:
    """msgspec's 'Expected `int`, got `str` - at `$.resources[0].count`' -> 'FILE:
    resources[0].count: expected an integer, got a string'."""
    key_problem = False
    if m := _AT_KEY.match(message):
        key_problem = True
    else:
        m = _AT.match(message)
    problem, path = (m["problem"], m["path"]) if m else (message, "$")
    path = path.removeprefix("$").removeprefix(".")
    if m := _UNKNOWN.match(problem):
        field = m["field"]
        if not field.isprintable() or not field.strip():
            field = repr(field)  # a key of newlines or control characters, shown as such
        path, problem = _join(path, field), "unknown key"
    elif m := _MISSING.match(problem):
        path, problem = _join(path, m["field"]), "required key is missing"
    elif m := _EXPECTED.match(problem):
        want, got = m["want"], m["got"]
        problem = f"expected {_TYPES.get(want, want)}"
        if got:
            problem += f", got {_TYPES.get(got, got)}"
        if key_problem:
            problem = f"keys must be strings: {problem}"
        if not path and want == "object":
            problem += " (the config must be a mapping with 'resources')"
    path = one_line(path.replace("[...]", "[*]"))
    return f"{source}: {path}: {one_line(problem)}" if path else f"{source}: {one_line(problem)}"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
