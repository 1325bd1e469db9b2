"""The report of a trace replayed under placement policies: per policy (means over the
seeds) GPU capacity allocated by request at 100 % arrived and at the end, unallocated
GPUs, the fragmentation measure, when each kind of pod first waited, pending pods by
reason class, and GPUs per model; beside the published numbers when the input is openb.

Units are never added together: GPUs are counted in GPUs (a share as its share), pods
in pods; CPU and memory are checks, not sums.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from devplug.ground.tables import table
from devplug.placement import REASONS
from devplug.plan import published

KINDS = ("cpu only", "share", "1 gpu", "2 gpus", "4 gpus", "8 gpus")


def _mean(values: Sequence[float]) -> float | None:
    return round(statistics.fmean(values), 2) if values else None


def _kinds(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    seen = {k for r in runs for k in r["first_wait_percent"]}
    return [k for k in KINDS if k in seen] + sorted(seen - set(KINDS))


def _first_wait(runs: Sequence[Mapping[str, Any]], kind: str) -> dict[str, Any]:
    """The mean arrived % when the first pod of the kind waited, over the seeds where one
    did (`waited_in`: how many)."""
    waits = [r["first_wait_percent"][kind] for r in runs if kind in r["first_wait_percent"]]
    return {"mean": _mean(waits), "waited_in": len(waits)}


def aggregate(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per policy, means over its seeds."""
    rows = []
    for policy in dict.fromkeys(r["policy"] for r in runs):
        mine = [r for r in runs if r["policy"] == policy]
        at100 = [r["at"]["100"] for r in mine if r["at"].get("100")]
        models: dict[str, dict[str, Any]] = {}
        for model in dict.fromkeys(m for r in mine for m in r["models"]):
            keys = mine[0]["models"][model]
            models[model] = {k: _mean([r["models"][model][k] for r in mine]) for k in keys}
        rows.append(
            {
                "policy": policy,
                "seeds": [r["seed"] for r in mine],
                "allocated_percent_at_100": _mean([a["allocated_percent"] for a in at100]),
                "fragmented_percent_at_100": _mean([a["fragmented_percent"] for a in at100]),
                "allocated_percent_at_end": _mean([r["end"]["allocated_percent"] for r in mine]),
                "arrived_percent_at_end": _mean([r["end"]["arrived_percent"] for r in mine]),
                "unallocated_gpus_at_end": _mean([r["end"]["unallocated_gpus"] for r in mine]),
                "fragmented_percent_at_end": _mean([r["end"]["fragmented_percent"] for r in mine]),
                "pending_pods": _mean([r["pending"] for r in mine]),
                # kind -> mean arrived % when the first pod of the kind waited, over the
                # seeds where one did (`waited_in`: how many)
                "first_wait_percent": {kind: _first_wait(mine, kind) for kind in _kinds(mine)},
                "pending_reasons": {
                    reason: _mean([r["pending_reasons"].get(reason, 0) for r in mine])
                    for reason in REASONS
                },
                "models": models,
            }
        )
    return rows


def trace_document(
    nodes_path: str,
    workload_path: str,
    cluster: Mapping[str, Any],
    protocol: Mapping[str, Any],
    target: list[dict[str, object]],
    runs: Sequence[Mapping[str, Any]],
    openb: bool,
) -> dict[str, Any]:
    return {
        "nodes": nodes_path,
        "workload": workload_path,
        "engine": "placement policies",
        "cluster": dict(cluster),
        "protocol": dict(protocol),
        "target_workload": target,
        "policies": aggregate(runs),
        "runs": list(runs),
        "published": published.reference() if openb else None,
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} %"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def trace_text(document: Mapping[str, Any]) -> str:
    cluster, protocol = document["cluster"], document["protocol"]
    models = ", ".join(f"{m} {c['gpus']}" for m, c in cluster["models"].items())
    seeds = ", ".join(str(s) for s in protocol["seeds"])
    inflate = protocol["inflate_percent"]
    order = f"GPU request {'inflated' if inflate else 'as listed'}" + (
        f" to {inflate:g} % of GPU capacity" if inflate else ""
    )
    lines = [
        f"placement of {document['workload']} on {document['nodes']} "
        f"(placement: {document['engine']})",
        f"  {cluster['nodes']} nodes, {cluster['gpus']} GPUs ({models})",
        f"  {protocol['pods']} pods, sorted by name and shuffled (seeds {seeds}), {order}, "
        "arrivals only",
        "  GPUs allocated by request (a share counts as its share), % of GPU capacity; "
        "means over the seeds",
        "",
    ]
    paper = document.get("published") or {}
    same = paper.get("same_as", {})
    table_of = paper.get("policies", {})

    def ref(policy: str, key: str) -> str:
        row = table_of.get(same.get(policy, ""), {})
        return _pct(row.get(key)) if key.endswith("percent_at_100") else _num(row.get(key))

    header = ["POLICY", "ALLOCATED AT 100 %", "FRAGMENTED AT 100 %", "ALLOCATED AT END",
              "UNALLOCATED GPUS AT END", "PENDING PODS"]  # fmt: skip
    rows = []
    for row in document["policies"]:
        cells = [
            row["policy"],
            _pct(row["allocated_percent_at_100"]),
            _pct(row["fragmented_percent_at_100"]),
            _pct(row["allocated_percent_at_end"]),
            _num(row["unallocated_gpus_at_end"]),
            _num(row["pending_pods"]),
        ]
        rows.append(cells)
        if paper and row["policy"] in same:
            rows.append(
                [
                    f"  paper: {same[row['policy']]}",
                    ref(row["policy"], "allocated_percent_at_100"),
                    ref(row["policy"], "fragmented_percent_at_100"),
                    _pct(table_of[same[row["policy"]]]["allocated_percent_at_130"]),
                    ref(row["policy"], "unallocated_gpus_at_130"),
                    "-",
                ]
            )
    lines += table(header, rows, indent="  ")
    kinds = [k for k in KINDS if any(k in r["first_wait_percent"] for r in document["policies"])]
    lines += ["", "  first pod refused, by kind (arrived GPU demand, % of capacity):"]
    rows = [
        [r["policy"], *(_pct(r["first_wait_percent"].get(k, {}).get("mean")) for k in kinds)]
        for r in document["policies"]
    ]
    lines += table(["POLICY", *(k.upper() for k in kinds)], rows, indent="  ")
    lines += ["", "  pending pods at the end, by reason class (furthest check a node passed):"]
    rows = [
        [r["policy"], *(_num(r["pending_reasons"][reason]) for reason in REASONS)]
        for r in document["policies"]
    ]
    lines += table(["POLICY", *(r.upper() for r in REASONS)], rows, indent="  ")
    lines += ["", "  GPUs per model at the end (stranded: free where no pending pod fits):"]
    rows = []
    for r in document["policies"]:
        for model, m in r["models"].items():
            rows.append(
                [r["policy"], model, _num(m["nodes"]), _num(m["gpus"]), _num(m["allocated"]),
                 _num(m["unallocated"]), _num(m["fragmented"]), _num(m["stranded"])]
            )  # fmt: skip
    header = ["POLICY", "MODEL", "NODES", "GPUS", "ALLOCATED", "UNALLOCATED", "FRAGMENTED",
              "STRANDED"]  # fmt: skip
    lines += table(header, rows, indent="  ")
    return "\n".join(lines)
