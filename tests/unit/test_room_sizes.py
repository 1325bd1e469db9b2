"""No hand-written module of devplug holds more than one room's worth: at most 500 lines
a file and 300 a class (docs/architecture.md). Generated code (`*_pb2*.py`) is not
counted. What could not be split yet is listed below, each with its reason; an entry
that no longer exceeds its limit fails the test, so the list only shrinks."""

from __future__ import annotations

import ast
from pathlib import Path

import devplug

PACKAGE = Path(devplug.__file__).parent
FILE_LIMIT = 500
CLASS_LIMIT = 300

# "path" (a file) or "path:Class", relative to src/devplug, with why it is still big.
EXCEPTIONS: dict[str, str] = {}


def oversized(path: Path, name: str) -> dict[str, int]:
    """`name` (and `name:Class`) with its length in lines, where over the limits."""
    text = path.read_text()
    found: dict[str, int] = {}
    lines = len(text.splitlines())
    if lines > FILE_LIMIT:
        found[name] = lines
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.ClassDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > CLASS_LIMIT:
                found[f"{name}:{node.name}"] = length
    return found


def rooms_too_big() -> dict[str, int]:
    found: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "_pb2" not in path.name:
            found |= oversized(path, path.relative_to(PACKAGE).as_posix())
    return found


def test_no_file_or_class_is_over_its_limit_unless_listed_with_its_reason() -> None:
    found = rooms_too_big()
    new = {k: v for k, v in found.items() if k not in EXCEPTIONS}
    assert not new, (
        f"over {FILE_LIMIT} lines a file or {CLASS_LIMIT} a class: {new}; split it along "
        "the seams of what it does (docs/architecture.md)"
    )


def test_every_listed_exception_is_still_over_its_limit() -> None:
    stale = sorted(EXCEPTIONS.keys() - rooms_too_big().keys())
    assert not stale, f"no longer too big, or gone: {stale}; take them off the list"


def test_a_long_file_and_a_long_class_are_caught(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(CLASS_LIMIT))
    source = tmp_path / "big.py"
    source.write_text(f"class Big:\n{body}\n\n\nclass Small:\n    pass\n")
    assert oversized(source, "big.py") == {"big.py:Big": CLASS_LIMIT + 1}
    source.write_text("\n".join(["x = 1"] * (FILE_LIMIT + 1)) + "\n")
    assert oversized(source, "big.py") == {"big.py": FILE_LIMIT + 1}
    source.write_text("\n".join(["x = 1"] * FILE_LIMIT) + "\n")
    assert oversized(source, "big.py") == {}
