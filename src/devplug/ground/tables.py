"""Plain-text tables for the commands' readable output."""

from __future__ import annotations

from collections.abc import Sequence


def table(
    header: Sequence[str] | None, rows: Sequence[Sequence[str]], indent: str = ""
) -> list[str]:
    """Lines of columns padded to their widest cell, two spaces apart (no header when
    `header` is None)."""
    lines = [list(r) for r in ([header] if header is not None else []) + list(rows)]
    if not lines:
        return []
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return [
        indent + "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    ]
