"""The plots of a trace report (plotly, the `report` extra, imported only here):
allocation against arrived GPU demand per policy, beside the paper's published points
when the input is openb; fragmentation against arrived demand; fragmented and stranded
GPUs per model; pending pods by reason class."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from devplug.placement import REASONS
from devplug.plan.plotstyle import legend_below, palette

ZOOM_FROM = 70  # % arrived where the allocation plot opens


def _mean_curves(runs: Sequence[Mapping[str, Any]], column: int) -> dict[str, list[list[float]]]:
    """Per policy, [arrived %, value] at each whole percent, the mean over its seeds."""
    sums: dict[str, dict[float, list[float]]] = {}
    for run in runs:
        points = sums.setdefault(run["policy"], {})
        for point in run["curve"]:
            total = points.setdefault(point[0], [0.0, 0])
            total[0] += point[column]
            total[1] += 1
    return {
        policy: [[a, round(v / n, 2)] for a, (v, n) in sorted(points.items())]
        for policy, points in sums.items()
    }


def _allocation(document: Mapping[str, Any]) -> Any:
    import plotly.graph_objects as go

    curves = _mean_curves(document["runs"], 1)
    paper = document.get("published") or {}
    colours = palette(len(curves) + len(paper.get("curves", {})))
    figure = go.Figure()
    for colour, (policy, points) in zip(colours, curves.items(), strict=False):
        figure.add_trace(
            go.Scatter(
                x=[p[0] for p in points],
                y=[p[1] for p in points],
                mode="lines",
                name=policy,
                line={"color": colour},
            )
        )
    # a published curve in the colour of devplug's policy of the same name, dotted
    same = {paper_name: policy for policy, paper_name in paper.get("same_as", {}).items()}
    mine = dict(zip(curves, colours, strict=False))
    others = iter(colours[len(curves) :])
    for name, points in paper.get("curves", {}).items():
        colour = mine.get(same.get(name, ""), "") or next(others)
        figure.add_trace(
            go.Scatter(
                x=[p[0] for p in points],
                y=[p[1] for p in points],
                mode="markers+lines",
                line={"dash": "dot", "color": colour},
                name=f"paper: {name}",
            )
        )
    # Below 70 % arrived every policy allocates what arrives: the view opens on the rest
    # (the toolbar's home button shows it all).
    end = max((p[0] for points in curves.values() for p in points), default=100)
    low = min((p[1] for points in curves.values() for p in points if p[0] >= ZOOM_FROM),
              default=ZOOM_FROM)  # fmt: skip
    figure.update_layout(
        title="GPU capacity allocated against GPU demand arrived (by request)",
        xaxis_title="GPU demand arrived, % of GPU capacity",
        yaxis_title="allocated, % of GPU capacity",
        xaxis_range=[ZOOM_FROM, max(end, 100) + 1],
        yaxis_range=[min(low, ZOOM_FROM) - 1, 100],
    )
    legend_below(figure, len(figure.data))
    return figure


def _fragmentation(document: Mapping[str, Any]) -> Any:
    import plotly.graph_objects as go

    curves = _mean_curves(document["runs"], 2)
    figure = go.Figure()
    for colour, (policy, points) in zip(palette(len(curves)), curves.items(), strict=True):
        figure.add_trace(
            go.Scatter(
                x=[p[0] for p in points],
                y=[p[1] for p in points],
                mode="lines",
                name=policy,
                line={"color": colour},
            )
        )
    figure.update_layout(
        title="Fragmentation against GPU demand arrived (the paper's measure)",
        xaxis_title="GPU demand arrived, % of GPU capacity",
        yaxis_title="fragmented, % of GPU capacity",
    )
    legend_below(figure, len(figure.data))
    return figure


def _per_model(document: Mapping[str, Any], key: str, title: str) -> Any:
    import plotly.graph_objects as go

    rows = document["policies"]
    figure = go.Figure()
    for colour, row in zip(palette(len(rows)), rows, strict=True):
        models = list(row["models"])
        figure.add_trace(
            go.Bar(
                x=models,
                y=[row["models"][m][key] for m in models],
                name=row["policy"],
                marker_color=colour,
            )
        )
    figure.update_layout(title=title, barmode="group", yaxis_title="GPUs", xaxis_title="model")
    legend_below(figure, len(rows))
    return figure


def _pending(document: Mapping[str, Any]) -> Any:
    import plotly.graph_objects as go

    rows = document["policies"]
    figure = go.Figure()
    for colour, reason in zip(palette(len(REASONS)), REASONS, strict=True):
        figure.add_trace(
            go.Bar(
                x=[r["policy"] for r in rows],
                y=[r["pending_reasons"][reason] for r in rows],
                name=reason,
                marker_color=colour,
            )
        )
    figure.update_layout(
        title="Pending pods at the end, by reason class", barmode="stack", yaxis_title="pods"
    )
    legend_below(figure, len(REASONS))
    return figure


def trace_figures(document: Mapping[str, Any]) -> list[Any]:
    return [
        _allocation(document),
        _fragmentation(document),
        _per_model(document, "fragmented", "Fragmented GPUs per model at the end"),
        _per_model(document, "stranded", "Stranded GPUs per model (free, no pending pod fits)"),
        _pending(document),
    ]
