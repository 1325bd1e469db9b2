"""The look the plots of both reports share (the capacity report's and the trace
report's): distinct colours and a legend that grows below the plot."""

from __future__ import annotations

from typing import Any


def palette(count: int) -> list[str]:
    """`count` distinct colours (up to 48 before any repeats): enough for 30 pools."""
    from plotly import colors

    colours = list(colors.qualitative.Dark24) + list(colors.qualitative.Light24)
    return [colours[i % len(colours)] for i in range(count)]


def legend_below(figure: Any, entries: int) -> None:
    """A legend under the plot, in rows, so many entries neither clip nor shrink it."""
    rows = max(1, (entries + 3) // 4)
    figure.update_layout(
        legend={"orientation": "h", "yanchor": "top", "y": -0.18, "x": 0},
        height=420 + 22 * rows,
        margin={"b": 80 + 22 * rows},
    )
