"""Reading the files devplug is given (configs, pod files, fleets, workloads, NVIDIA's
config, kubeconfigs, CSV): the one way, bounded before the work.

A file is refused with one `InputError` line naming it, the limit and the value when it
is bigger than `max_bytes` (checked on its size, and read no further than that), not
UTF-8 (a byte-order mark is dropped), nested deeper than `max_depth`, or when its YAML
aliases would expand it beyond `max_expanded` (a 1 KB "billion laughs" file names a
million copies of one list: the parser shares them, whatever reads the result does
not). Depth and expansion are measured on the parser's event stream, which holds one
event at a time, before any object is built.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    import yaml

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class Limits:
    # A file's size in bytes.
    max_bytes: int = 4 * MIB
    # Mappings and lists inside each other.
    max_depth: int = 100
    # What aliases may make of a document: its expanded size (every scalar's length
    # plus one per node) may reach this many bytes, or `alias_ratio` times the text.
    max_expanded: int = 64 * KIB
    alias_ratio: int = 4


DEFAULT_LIMITS = Limits()
# Pod files, workloads and fleets list many objects: a larger file is fine.
LARGE_LIMITS = Limits(max_bytes=16 * MIB)


class InputError(ValueError):
    """A file devplug cannot use as input; the message is one line naming it:
    '{name}: {problem}'."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"{name}: {problem}")
        self.name = name
        self.problem = problem


def _size(n: int) -> str:
    return f"{n / MIB:.1f} MiB" if n >= MIB else f"{n / KIB:.0f} KiB" if n >= KIB else f"{n} B"


def read_bytes(
    path: str | os.PathLike[str], limits: Limits = DEFAULT_LIMITS, *, what: str = "it"
) -> bytes:
    """The bytes of `path` ('-': stdin), at most `limits.max_bytes` of them, else an
    InputError; a file that cannot be read is an InputError with the system's reason
    ('FILE: cannot read {what}: ...')."""
    name = os.fspath(path)
    try:
        if name == "-":
            return _bounded(sys.stdin.buffer, "stdin", limits, what)
        with open(name, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > limits.max_bytes:  # a regular file says its size before it is read
                raise too_big(name, size, limits, what)
            return _bounded(f, name, limits, what)
    except OSError as error:
        raise InputError(name, f"cannot read {what}: {error.strerror or error}") from None


def _bounded(f: BinaryIO, name: str, limits: Limits, what: str = "it") -> bytes:
    data = f.read(limits.max_bytes + 1)  # a pipe or /proc file: read one byte too many
    if len(data) > limits.max_bytes:
        raise too_big(name, len(data), limits, what)
    return data


def too_big(name: str, size: int, limits: Limits, what: str = "it") -> InputError:
    over = "more than " if size == limits.max_bytes + 1 else ""
    subject = "the file" if what == "it" else what
    return InputError(
        name,
        f"{subject} is {over}{_size(size)}: the limit is {_size(limits.max_bytes)} "
        f"({limits.max_bytes} bytes)",
    )


def decode(data: bytes, name: str, *, what: str = "it") -> str:
    """UTF-8 text without its byte-order mark, or an InputError saying where it is not."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        problem = f"cannot read {what}: not UTF-8 text (byte {error.start + 1})"
        raise InputError(name, problem) from None


def read_text(
    path: str | os.PathLike[str], limits: Limits = DEFAULT_LIMITS, *, what: str = "it"
) -> str:
    """`read_bytes` decoded by `decode`."""
    name = os.fspath(path)
    data = read_bytes(name, limits, what=what)
    return decode(data, "stdin" if name == "-" else name, what=what)


def check_text(text: str, name: str, limits: Limits = DEFAULT_LIMITS) -> None:
    """Refuse text given as such (a library caller's string) that a file of it would
    be refused for: its UTF-8 size."""
    if len(text) > limits.max_bytes // 4 and (size := len(text.encode())) > limits.max_bytes:
        raise too_big(name, size, limits, "the text")


def load_yaml(text: str, name: str, limits: Limits = DEFAULT_LIMITS) -> Any:
    """The one YAML document of `text` (None when empty), bounded; YAML errors are
    InputErrors too, `name:line:column: invalid YAML: problem`. JSON is YAML."""
    documents = load_yaml_all(text, name, limits, single=True)
    return documents[0] if documents else None


def load_yaml_all(
    text: str, name: str, limits: Limits = DEFAULT_LIMITS, *, single: bool = False
) -> list[Any]:
    """Every YAML document of `text` (empty ones included, as None), bounded."""
    import yaml

    check_text(text, name, limits)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        _measure(yaml.parse(text, Loader=loader), name, limits, len(text))
        if single:
            return [yaml.load(text, Loader=loader)]
        return list(yaml.load_all(text, Loader=loader))
    except yaml.YAMLError as error:
        where, _, problem = yaml_problem(error, name, text).partition(": invalid YAML: ")
        if "nesting depth" in problem:  # libyaml's own limit, met scanning ahead of ours
            raise InputError(where, _too_deep(limits)) from None
        raise InputError(where, f"invalid YAML: {problem}") from None
    except RecursionError:  # a constructor's own recursion, below max_depth
        raise InputError(name, "nested too deep to read") from None


def _measure(events: Any, name: str, limits: Limits, length: int) -> None:
    """Walk the event stream: InputError when nesting passes `max_depth` or aliases
    expand the documents past their limit, before the objects are built."""
    import yaml

    allowed = max(limits.max_expanded, limits.alias_ratio * length)
    expanded = 0
    depth = 0
    open_nodes: list[tuple[str | None, int]] = []  # (anchor, expanded size at its start)
    sizes: dict[str, int] = {}  # anchor -> the expanded size of its node
    for event in events:
        grown = 0
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > limits.max_depth:
                raise InputError(_at(name, event), _too_deep(limits))
            open_nodes.append((event.anchor, expanded))
            grown = 1
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
            anchor, start = open_nodes.pop()
            if anchor is not None:
                sizes[anchor] = expanded - start
        elif isinstance(event, yaml.ScalarEvent):
            grown = 1 + len(event.value)
            if event.anchor is not None:
                sizes[event.anchor] = grown
        elif isinstance(event, yaml.AliasEvent):
            if event.anchor in sizes:
                grown = sizes[event.anchor]
            elif any(anchor == event.anchor for anchor, _ in open_nodes):
                raise InputError(
                    _at(name, event),
                    f"alias *{event.anchor} refers to a node that holds it: a recursive "
                    "document is not read",
                )
        elif isinstance(event, yaml.DocumentStartEvent):
            sizes.clear()  # anchors belong to one document
        expanded += grown
        if expanded > allowed:
            raise InputError(
                name,
                f"YAML aliases expand it to more than {_size(allowed)}: the limit is "
                f"{limits.alias_ratio}x the file or {_size(limits.max_expanded)}",
            )


def _too_deep(limits: Limits) -> str:
    return f"nested deeper than {limits.max_depth} mappings and lists (the limit)"


def _at(name: str, event: Any) -> str:
    mark = event.start_mark
    return f"{name}:{mark.line + 1}" if mark is not None else name


def yaml_problem(error: yaml.YAMLError, source: str, text: str = "") -> str:
    """One line for text that is no YAML: `source:line:column: invalid YAML: problem`.
    libyaml places an error at the end of a text without a final newline on the line
    after it; it is told at the end of the last line instead, where the text stops."""
    mark = getattr(error, "problem_mark", None)
    where = source
    if mark is not None:
        line, column = mark.line, mark.column
        if text and not text.endswith("\n") and line > 0 and line == text.count("\n") + 1:
            line, column = line - 1, len(text.rsplit("\n", 1)[-1])
        where = f"{source}:{line + 1}:{column + 1}"
    problem = getattr(error, "problem", None) or str(error)
    return f"{where}: invalid YAML: {' '.join(str(problem).split())}"
