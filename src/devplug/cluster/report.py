"""Forms of a cluster run: a readable report, or records for `-o json|yaml`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from devplug.cluster.cluster import ADMITTED, REJECTED, UNSCHEDULABLE, NodeSummary, Placement
from devplug.ground.tables import table
from devplug.simulator.report import container_record, results_text
from devplug.simulator.results import PodResult


def _why(placement: Placement) -> str:
    if placement.status == ADMITTED:
        return ""
    if placement.status == UNSCHEDULABLE or not placement.reason:
        return placement.message
    return f"{placement.reason}: {placement.message}"


def _nodes_line(placement: Placement) -> list[str]:
    """Per node: its score, or why it does not fit, the chosen node first."""
    lines = []
    for node, score in placement.scores.items():
        mark = "picked" if node == placement.node else "fits"
        lines.append(f"  {node}: {mark}, score {score}")
    for node, reasons in placement.unfit.items():
        lines.append(f"  {node}: {', '.join(reasons)}")
    lines.sort(key=lambda line: "picked" not in line)
    return lines


def _detail(placement: Placement) -> list[str]:
    key = f"{placement.namespace}/{placement.pod}"
    requests = ", ".join(f"{r}: {n}" for r, n in placement.requests.items()) or "none"
    if placement.status == ADMITTED:
        head = f"pod {key} -> {placement.node} (requests {requests})"
    elif placement.status == REJECTED:
        head = f"pod {key} -> {placement.node}: rejected by the kubelet: {_why(placement)}"
    elif placement.status == UNSCHEDULABLE:
        head = f"pod {key}: unschedulable: {placement.message}"
    else:
        head = f"pod {key}: refused: {_why(placement)}"
    lines = [head, *_nodes_line(placement)]
    if placement.containers:
        result = PodResult(
            placement.pod, placement.namespace, placement.uid, True, containers=placement.containers
        )
        lines += results_text([result]).splitlines()[1:]
    return lines


def report_text(placements: Sequence[Placement], nodes: Sequence[NodeSummary]) -> str:
    """A summary table of the pods, each pod's nodes and containers, then the nodes."""
    rows = [[f"{p.namespace}/{p.pod}", p.node or "-", p.status, _why(p)] for p in placements]
    lines = table(["POD", "NODE", "STATUS", "REASON"], rows)
    for placement in placements:
        lines.append("")
        lines += _detail(placement)
    node_rows = [
        [n.node, r.name, str(r.capacity), str(r.allocatable), str(r.allocated), str(r.requested)]
        for n in nodes
        for r in n.resources
    ]
    if node_rows:
        lines.append("")
        lines += table(
            ["NODE", "RESOURCE", "CAPACITY", "ALLOCATABLE", "ALLOCATED", "REQUESTED"], node_rows
        )
    return "\n".join(lines)


def report_records(
    placements: Sequence[Placement], nodes: Sequence[NodeSummary]
) -> list[dict[str, Any]]:
    """One `{"kind": "pod", ...}` record per pod, then one `{"kind": "node", ...}` per node."""
    records = []
    for p in placements:
        record: dict[str, Any] = {
            "kind": "pod",
            "pod": p.pod,
            "namespace": p.namespace,
            "uid": p.uid,
            "status": p.status,
            "node": p.node,
            "reason": p.reason,
            "message": p.message,
            "requests": p.requests,
            "scores": p.scores,
            "unfit": p.unfit,
            "containers": [container_record(c) for c in p.containers],
        }
        records.append(record)
    for n in nodes:
        records.append({"kind": "node", **msgspec.to_builtins(n)})
    return records
