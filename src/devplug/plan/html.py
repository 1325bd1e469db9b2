"""The capacity report as one self-contained HTML page with plots drawn by plotly (the
`report` extra, imported only here): device utilisation per pool over the run, stranded
devices per pool and run, and why pods are pending or failed. The page carries
plotly.js inline, so it opens without a network."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from devplug.plan.plotstyle import legend_below, palette
from devplug.plan.report import report_text


def _utilisation(document: Mapping[str, Any]) -> Any:
    import plotly.graph_objects as go

    figure = go.Figure()
    pools = list(dict.fromkeys(p for s in document["runs"] for p in s["pools"]))
    colour = dict(zip(pools, palette(len(pools)), strict=True))
    dashes = ("solid", "dot", "dash", "longdash", "dashdot", "longdashdot")
    for number, summary in enumerate(document["runs"]):
        for pool, counts in summary["pools"].items():
            capacity = sum(d["capacity"] for d in counts["devices"].values())
            if not capacity:
                continue
            used = [100 * point.get(pool, 0) / capacity for point in summary["timeline"]]
            figure.add_trace(
                go.Scatter(
                    x=list(range(1, len(used) + 1)),
                    y=used,
                    mode="lines",
                    name=f"{pool} ({summary['variant']})",
                    line={"color": colour[pool], "dash": dashes[number % len(dashes)]},
                )
            )
    figure.update_layout(
        title="Devices in use per pool over the run",
        xaxis_title="pods placed, in workload order",
        yaxis_title="% of the pool's devices",
        yaxis_range=[0, 100],
    )
    legend_below(figure, len(figure.data))
    return figure


def _stranded(document: Mapping[str, Any]) -> Any:
    import plotly.graph_objects as go

    figure = go.Figure()
    runs = document["runs"]
    for summary, colour in zip(runs, palette(len(runs)), strict=True):
        pools = list(summary["pools"])
        figure.add_trace(
            go.Bar(
                marker_color=colour,
                x=pools,
                y=[
                    sum(d["stranded"] for d in summary["pools"][p]["devices"].values())
                    for p in pools
                ],
                name=summary["variant"],
            )
        )
    figure.update_layout(
        title="Stranded devices (free where no pending pod fits)",
        barmode="group",
        yaxis_title="devices",
    )
    legend_below(figure, len(runs))
    return figure


def _reasons(document: Mapping[str, Any]) -> Any:
    import plotly.graph_objects as go

    per_reason: dict[str, dict[str, int]] = {}
    variants = [s["variant"] for s in document["runs"]]
    for summary in document["runs"]:
        for reason, info in summary["pending_reasons"].items():
            per_reason.setdefault(f"scheduler: {reason}", {})[summary["variant"]] = info["pods"]
        for reason, info in summary["kubelet_reasons"].items():
            per_reason.setdefault(f"kubelet: {reason}", {})[summary["variant"]] = info["pods"]
    figure = go.Figure()
    for (reason, counts), colour in zip(
        sorted(per_reason.items()), palette(len(per_reason)), strict=True
    ):
        figure.add_trace(
            go.Bar(
                x=variants,
                y=[counts.get(v, 0) for v in variants],
                name=reason,
                marker_color=colour,
            )
        )
    figure.update_layout(title="Pods not running, by reason", barmode="stack", yaxis_title="pods")
    legend_below(figure, len(per_reason))
    return figure


def _page(title: str, engine: str, figures: list[Any], text: str) -> str:
    parts = [
        figure.to_html(full_html=False, include_plotlyjs=index == 0, div_id=f"plot-{index}")
        for index, figure in enumerate(figures)
    ]
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        f"<p>Placement: {html.escape(engine)}.</p>"
        + "".join(parts)
        + f"<pre>{html.escape(text)}</pre></body></html>\n"
    )


def report_html(document: Mapping[str, Any]) -> str:
    figures = [_utilisation(document), _stranded(document), _reasons(document)]
    title = f"Capacity of {document['fleet']} for {document['workload']}"
    return _page(title, document["engine"], figures, report_text(document))


def trace_html(document: Mapping[str, Any]) -> str:
    """The trace report as a page (`trace_plots`)."""
    from devplug.plan.trace_plots import trace_figures
    from devplug.plan.trace_report import trace_text

    return _page(
        f"Placement of {document['workload']} on {document['nodes']}",
        document["engine"],
        trace_figures(document),
        trace_text(document),
    )
