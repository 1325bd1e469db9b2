"""A trace's pods arriving on its nodes under one placement policy, as the paper's
protocol has them: the pods sorted by name and shuffled with a seed, copies of pods
drawn at random (with the same seed) appended until the GPU request reaches a share
of the cluster's GPU capacity (or pods drawn out while it is above), then each pod
placed in turn or left pending; pods never leave, nothing is preempted.

Each pod is a point: the GPU demand arrived so far and the GPU capacity allocated, by
request (a share counts as its share), and the cluster's fragmentation.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from devplug.placement import MILLI, Node, Placer, TargetWorkload, make_policy
from devplug.placement.trace import TraceError, TracePod

MARKS = (100,)  # arrived demand (% of GPU capacity) the report reads the run at


def arrivals(
    pods: Sequence[TracePod], seed: int, inflate_percent: float, capacity_milli: int
) -> list[TracePod]:
    """The pods in the order they arrive."""
    rng = random.Random(seed)
    by_name = sorted(pods, key=lambda p: p.name)
    order = list(by_name)
    rng.shuffle(order)
    if inflate_percent <= 0:
        return order
    target = inflate_percent / 100 * capacity_milli
    total = sum(p.demand.total_milli for p in order)
    while total > target and order:
        total -= order.pop(rng.randrange(len(order))).demand.total_milli
    copies = 0
    while by_name:
        pod = by_name[rng.randrange(len(by_name))]
        if total + pod.demand.total_milli > target:
            break
        order.append(replace(pod, name=f"{pod.name}-copy-{copies}"))
        total += pod.demand.total_milli
        copies += 1
    return order


@dataclass
class Replay:
    """One run: a policy, a seed, and what happened to each pod."""

    policy: str
    seed: int
    capacity_milli: int
    # per pod, in arrival order: GPU milli arrived, allocated, cluster fragmentation
    arrived: list[int] = field(default_factory=list)
    allocated: list[int] = field(default_factory=list)
    fragmented: list[float] = field(default_factory=list)
    first_wait: dict[str, float] = field(default_factory=dict)  # kind -> arrived %
    pending: Counter[str] = field(default_factory=Counter)  # reason class -> pods
    pending_kinds: Counter[str] = field(default_factory=Counter)
    placed: int = 0
    nodes: list[Node] = field(default_factory=list)
    node_fragmentation: list[float] = field(default_factory=list)
    stranded: list[bool] = field(default_factory=list)  # no pending pod fits the node


def fresh(nodes: Sequence[Node]) -> list[Node]:
    return [
        Node(n.name, n.cpu, n.memory, n.model, list(n.gpu_free), gpu_link=n.gpu_link,
             gpu_numa=n.gpu_numa)
        for n in nodes
    ]  # fmt: skip


def replay(
    nodes: Sequence[Node],
    order: Sequence[TracePod],
    policy_name: str,
    target: TargetWorkload,
    seed: int = 0,
) -> Replay:
    """Place `order` on a fresh copy of `nodes` with the policy."""
    cluster = fresh(nodes)
    placer = Placer(cluster, make_policy(policy_name, cluster, target))
    capacity = sum(n.gpus for n in cluster) * MILLI
    run = Replay(policy_name, seed, capacity, nodes=cluster)
    per_node = [target.node(n) for n in cluster]
    fragmented = sum(per_node)
    arrived = allocated = 0
    pending_demands = set()
    for pod in order:
        demand = pod.demand
        arrived += demand.total_milli
        choice = placer.place(demand)
        if choice is None:
            run.first_wait.setdefault(demand.kind, 100 * arrived / capacity)
            run.pending[placer.reason(demand)] += 1
            run.pending_kinds[demand.kind] += 1
            pending_demands.add(demand)
        else:
            run.placed += 1
            allocated += demand.total_milli
            now = target.node(cluster[choice.node])
            fragmented += now - per_node[choice.node]
            per_node[choice.node] = now
        run.arrived.append(arrived)
        run.allocated.append(allocated)
        run.fragmented.append(fragmented)
    run.node_fragmentation = per_node
    run.stranded = [
        bool(pending_demands) and not any(n.fits(d) for d in pending_demands) for n in cluster
    ]
    return run


def at_mark(run: Replay, percent: float) -> dict[str, float] | None:
    """Allocation and fragmentation (% of GPU capacity) where the arrived demand is within
    half a point of `percent`: the mean over those pods, as the paper reads its runs."""
    low = (percent - 0.5) * run.capacity_milli / 100
    high = (percent + 0.5) * run.capacity_milli / 100
    picked = [i for i, a in enumerate(run.arrived) if low <= a < high]
    if not picked:
        return None
    scale = 100 / run.capacity_milli
    return {
        "allocated_percent": sum(run.allocated[i] for i in picked) * scale / len(picked),
        "fragmented_percent": sum(run.fragmented[i] for i in picked) * scale / len(picked),
    }


def curve(run: Replay) -> list[list[float]]:
    """[arrived %, allocated %, fragmented %] at each whole percent of arrived demand."""
    sums: dict[int, list[float]] = {}
    scale = 100 / run.capacity_milli
    for arrived, allocated, fragmented in zip(
        run.arrived, run.allocated, run.fragmented, strict=True
    ):
        point = sums.setdefault(round(arrived * scale), [0.0, 0.0, 0])
        point[0] += allocated * scale
        point[1] += fragmented * scale
        point[2] += 1
    return [
        [percent, round(a / n, 2), round(f / n, 2)] for percent, (a, f, n) in sorted(sums.items())
    ]


def per_model(run: Replay) -> dict[str, dict[str, float]]:
    """At the end, per GPU model: nodes, GPUs, allocated, unallocated, fragmented and
    stranded GPUs (free GPU capacity on nodes no pending pod fits), in GPUs."""
    models: dict[str, dict[str, float]] = {}
    for node, fragment, stranded in zip(
        run.nodes, run.node_fragmentation, run.stranded, strict=True
    ):
        if not node.gpus:
            continue
        free = sum(node.gpu_free)
        row = models.setdefault(
            node.model,
            {"nodes": 0, "gpus": 0, "allocated": 0.0, "unallocated": 0.0, "fragmented": 0.0,
             "stranded": 0.0},
        )  # fmt: skip
        row["nodes"] += 1
        row["gpus"] += node.gpus
        row["allocated"] += (node.gpus * MILLI - free) / MILLI
        row["unallocated"] += free / MILLI
        row["fragmented"] += fragment / MILLI
        row["stranded"] += free / MILLI if stranded else 0.0
    return {
        model: {k: round(v, 2) for k, v in row.items()} for model, row in sorted(models.items())
    }


def summary(run: Replay, marks: Sequence[int] = MARKS) -> dict[str, object]:
    """One run as the report shows it."""
    scale = 100 / run.capacity_milli
    end: Mapping[str, float] = {
        "arrived_percent": run.arrived[-1] * scale if run.arrived else 0.0,
        "allocated_percent": run.allocated[-1] * scale if run.allocated else 0.0,
        "fragmented_percent": run.fragmented[-1] * scale if run.fragmented else 0.0,
        "unallocated_gpus": (run.capacity_milli - (run.allocated[-1] if run.allocated else 0))
        / MILLI,
    }
    return {
        "policy": run.policy,
        "seed": run.seed,
        "pods": len(run.arrived),
        "placed": run.placed,
        "pending": len(run.arrived) - run.placed,
        "at": {
            str(mark): {k: round(v, 2) for k, v in (at_mark(run, mark) or {}).items()}
            for mark in marks
        },
        "end": {k: round(v, 2) for k, v in end.items()},
        "first_wait_percent": {k: round(v, 2) for k, v in sorted(run.first_wait.items())},
        "pending_reasons": dict(run.pending.most_common()),
        "pending_kinds": dict(run.pending_kinds.most_common()),
        "models": per_model(run),
        "curve": curve(run),
    }


def plan_trace(
    nodes_path: str,
    pods_path: str,
    policies: Sequence[str],
    seeds: Sequence[int],
    inflate_percent: float,
) -> dict[str, Any]:
    """The whole report: the trace read, each policy replayed with each seed (TraceError
    for a bad trace)."""
    from devplug.placement.trace import read_nodes, read_pods
    from devplug.plan import published
    from devplug.plan.trace_report import trace_document

    nodes = read_nodes(nodes_path)
    pods = read_pods(pods_path)
    capacity = sum(n.gpus for n in nodes) * MILLI
    if not capacity:
        raise TraceError(f"{nodes_path}: no node has a GPU")
    target = TargetWorkload.of(p.demand for p in pods)
    runs = []
    sizes = []
    for seed in seeds:
        order = arrivals(pods, seed, inflate_percent, capacity)
        sizes.append(len(order))
        for policy in policies:
            runs.append(summary(replay(nodes, order, policy, target, seed)))
    models: dict[str, dict[str, int]] = {}
    for node in nodes:
        if node.gpus:
            row = models.setdefault(node.model, {"nodes": 0, "gpus": 0})
            row["nodes"] += 1
            row["gpus"] += node.gpus
    cluster = {
        "nodes": len(nodes),
        "gpus": capacity // MILLI,
        "models": dict(sorted(models.items())),
        "cpu_milli": sum(n.cpu for n in nodes),
        "memory_mib": sum(n.memory for n in nodes),
    }
    protocol = {
        "workload_pods": len(pods),
        "pods": f"{min(sizes)}-{max(sizes)}" if min(sizes) != max(sizes) else str(sizes[0]),
        "seeds": list(seeds),
        "inflate_percent": inflate_percent,
        "order": "sorted by name, shuffled with the seed",
        "arrivals_only": True,
    }
    openb = published.is_openb_default(nodes, pods)
    return trace_document(nodes_path, pods_path, cluster, protocol, target.describe(), runs, openb)
