"""The capacity report: per pool and overall, devices used, free and stranded, pods
running, failed and pending with the scheduler's and the kubelet's reasons, per run,
and how the runs compare. JSON and a terminal table; `devplug.plan.html` draws it.

Stranded devices are free devices on nodes where none of the pending pods fits (the fit
step's filter against what the node has left); with no pod pending nothing is stranded.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from devplug.fleet.requests import pod_requests
from devplug.ground.tables import table
from devplug.plan.engine import Run
from devplug.plan.fit import NodeView, reasons

PHASES = ("Running", "Failed", "Pending")


def _pending_needs(run: Run) -> list[tuple[Mapping[str, Any], dict[str, int], dict[str, int]]]:
    pending = {p.name for p in run.pods if p.phase == "Pending"}
    needs = []
    for planned in run.planned:
        if planned.name not in pending:
            continue
        manifest = planned.manifest
        needs.append((manifest["spec"], pod_requests(manifest), planned.claims))
    return needs


def _stranded(node: NodeView, needs: Sequence[Any]) -> bool:
    return bool(needs) and all(
        reasons(spec, requests, claims, node) for spec, requests, claims in needs
    )


def scheduler_reasons(message: str) -> Counter[str]:
    """'0/3 nodes are available: 1 Insufficient cpu, 2 Too many pods.' -> counts per
    reason (nodes), as the scheduler's FitError message lists them."""
    _, _, rest = message.partition(": ")
    rest = rest.split(" preemption:")[0].strip()
    found: Counter[str] = Counter()
    for part in rest.rstrip(".").split(", "):
        count, _, reason = part.partition(" ")
        if count.isdigit() and reason:
            found[reason] += int(count)
    return found


def reason_class(message: str) -> str:
    """A pending pod's reason class: the scheduler's reason most nodes gave."""
    found = scheduler_reasons(message)
    return found.most_common(1)[0][0] if found else "pending"


def _classes(messages: Counter[str]) -> dict[str, dict[str, Any]]:
    """Pending pods per reason class, with the message of the most of them (thousands of
    pods give hundreds of messages, a few classes)."""
    classes: dict[str, dict[str, Any]] = {}
    for message, pods in messages.most_common():
        row = classes.setdefault(reason_class(message), {"pods": 0, "messages": 0})
        row["pods"] += pods
        row["messages"] += 1
        row.setdefault("example", message)
    return dict(sorted(classes.items(), key=lambda item: -item[1]["pods"]))


def summarize(run: Run) -> dict[str, Any]:
    needs = _pending_needs(run)
    pools: dict[str, dict[str, Any]] = {}
    for node in run.nodes:
        pool = pools.setdefault(
            node.pool,
            {"nodes": 0, "devices": {}, "pods": dict.fromkeys(PHASES, 0)},
        )
        pool["nodes"] += 1
        stranded = _stranded(node, needs)
        for resource in run.devices.get(node.pool, []):
            capacity = node.allocatable.get(resource, 0)
            used = node.requested.get(resource, 0)
            counts = pool["devices"].setdefault(
                resource, {"capacity": 0, "used": 0, "free": 0, "stranded": 0}
            )
            counts["capacity"] += capacity
            counts["used"] += used
            counts["free"] += capacity - used
            counts["stranded"] += capacity - used if stranded else 0
    pending_reasons: Counter[str] = Counter()
    failed_reasons: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for pod in run.pods:
        if pod.pool is not None and pod.phase != "Pending":
            pools[pod.pool]["pods"][pod.phase] += 1
        elif pod.pool is not None:
            pools[pod.pool]["pods"]["Pending"] += 1
        if pod.phase == "Failed" or (pod.phase == "Pending" and pod.node is not None):
            failed_reasons[pod.reason] += 1
            examples.setdefault(pod.reason, pod.message)
        elif pod.phase == "Pending":
            pending_reasons[pod.message] += 1
    overall_devices: dict[str, dict[str, int]] = {}
    for pool in pools.values():
        for resource, counts in pool["devices"].items():
            total = overall_devices.setdefault(resource, dict.fromkeys(counts, 0))
            for key, value in counts.items():
                total[key] += value
    shared = _shared(run, pools)
    pods = Counter(p.phase for p in run.pods)
    return {
        "variant": run.variant.name,
        "engine": run.engine,
        "pools": pools,
        "overall": {
            "nodes": len(run.nodes),
            "devices": overall_devices,
            "pods": {phase: pods.get(phase, 0) for phase in PHASES},
        },
        # resources served as several units per physical device (time-slicing, sharing):
        # the units are not capacity; the physical devices are
        "shared": shared,
        "scheduler_reasons": dict(pending_reasons.most_common()),
        "pending_reasons": _classes(pending_reasons),
        "kubelet_reasons": {
            reason: {"pods": count, "message": examples[reason]}
            for reason, count in failed_reasons.most_common()
        },
        "timeline": run.timeline,
        "pods": [
            {
                "pod": p.name,
                "phase": p.phase,
                "node": p.node,
                "pool": p.pool,
                "reason": p.reason,
                "message": p.message,
            }
            for p in run.pods
        ],
    }


def _shared(run: Run, pools: Mapping[str, Any]) -> dict[str, dict[str, dict[str, int]]]:
    """Per pool, each resource with more units than physical devices: its units,
    physical devices, units used and physical devices in use."""
    shared: dict[str, dict[str, dict[str, int]]] = {}
    for pool, resources in run.physical.items():
        for resource, (devices, busy) in resources.items():
            counts = pools.get(pool, {}).get("devices", {}).get(resource)
            if counts is None or not devices or counts["capacity"] <= devices:
                continue
            shared.setdefault(pool, {})[resource] = {
                "units": counts["capacity"],
                "devices": devices,
                "units_used": counts["used"],
                "devices_in_use": busy,
            }
    return shared


def report_document(
    fleet: str, workload: str, engine: str, summaries: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    return {
        "fleet": fleet,
        "workload": workload,
        "engine": engine,
        "runs": list(summaries),
        "comparison": [_comparison(s) for s in summaries],
    }


def _comparison(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A run's pods, and its devices per resource (never added across resources; a
    shared resource's units beside its physical devices)."""
    shared: dict[str, dict[str, int]] = {}
    for resources in summary.get("shared", {}).values():
        for resource, counts in resources.items():
            total = shared.setdefault(resource, {"devices": 0, "devices_in_use": 0})
            total["devices"] += counts["devices"]
            total["devices_in_use"] += counts["devices_in_use"]
    devices = {
        resource: dict(counts) | ({"physical": shared[resource]} if resource in shared else {})
        for resource, counts in summary["overall"]["devices"].items()
    }
    return {"variant": summary["variant"], **summary["overall"]["pods"], "devices": devices}


def report_text(document: Mapping[str, Any]) -> str:
    lines = [
        f"capacity of {document['fleet']} for {document['workload']} "
        f"(placement: {document['engine']})"
    ]
    for summary in document["runs"]:
        lines += ["", f"run {summary['variant']}:"]
        rows = []
        for name, pool in [*summary["pools"].items(), ("(all)", summary["overall"])]:
            pods = pool["pods"]
            for resource, c in pool["devices"].items() or [("-", {})]:
                rows.append(
                    [
                        name,
                        str(pool["nodes"]),
                        resource,
                        *(str(c.get(k, "-")) for k in ("capacity", "used", "free", "stranded")),
                        *(str(pods[phase]) for phase in PHASES),
                    ]
                )
        header = ["POOL", "NODES", "DEVICES", "CAPACITY", "USED", "FREE", "STRANDED"]
        lines += table([*header, "RUNNING", "FAILED", "PENDING"], rows, indent="  ")
        for reason, info in summary["pending_reasons"].items():
            more = info["messages"] - 1
            also = f" (and {more} other message{'s' * (more > 1)})" if more else ""
            lines.append(f"  pending {info['pods']}: {reason}: {info['example']}{also}")
        for reason, info in summary["kubelet_reasons"].items():
            lines.append(f"  failed {info['pods']}: {reason}: {info['message']}")
        for pool, resources in summary.get("shared", {}).items():
            for resource, c in resources.items():
                lines.append(
                    f"  shared {pool} {resource}: {c['units']} units on {c['devices']} "
                    f"devices ({c['units_used']} units used, on {c['devices_in_use']} devices); "
                    "units are not capacity"
                )
    if len(document["runs"]) > 1:
        lines += ["", "compared:"]
        rows = [[c["variant"], *(str(c[k]) for k in PHASES)] for c in document["comparison"]]
        lines += table(["RUN", "RUNNING", "FAILED", "PENDING"], rows, indent="  ")
        rows = []
        for c in document["comparison"]:
            for resource, d in c["devices"].items():
                physical = d.get("physical")
                shared = (
                    f"{d['capacity']} units on {physical['devices']} devices" if physical else "-"
                )
                rows.append(
                    [c["variant"], resource, *(str(d[k]) for k in ("capacity", "used", "free",
                     "stranded")), shared]
                )  # fmt: skip
        header = ["RUN", "DEVICES", "CAPACITY", "USED", "FREE", "STRANDED", "SHARED"]
        lines += ["", *table(header, rows, indent="  ")]
    return "\n".join(lines)
