"""The scheduler's filter and score for a capacity run without an API server: the
cluster view's fit step (`devplug.cluster.scheduler`) widened to what a fleet has,
CPU, memory, pod count, node selectors and taints, with the scheduler's reasons.

It counts as NodeResourcesFit does (requests against allocatable), matches
`nodeSelector` and the NoSchedule/NoExecute taints a pod does not tolerate, and scores
the nodes that fit by LeastAllocated over CPU and memory (the scheduler's default), the
first node in fleet order winning a tie. No affinity, spreading or preemption.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from devplug.kube.fiterror import fit_error
from devplug.kube.scoring import least_allocated_score
from devplug.kube.tolerations import tolerates

SELECTOR_MISMATCH = "node(s) didn't match Node's node affinity/selector"
CANNOT_ALLOCATE_CLAIMS = "cannot allocate all claims"


@dataclass
class NodeView:
    """What the scheduler knows of a node."""

    name: str
    pool: str
    labels: Mapping[str, str]
    taints: Sequence[Mapping[str, str]]
    allocatable: dict[str, int]
    requested: dict[str, int] = field(default_factory=dict)
    # DRA: free devices per driver (names in the node's slices)
    free_devices: dict[str, list[str]] = field(default_factory=dict)

    def free(self, resource: str) -> int:
        return self.allocatable.get(resource, 0) - self.requested.get(resource, 0)


def reasons(
    spec: Mapping[str, Any],
    requests: Mapping[str, int],
    claims: Mapping[str, int],
    node: NodeView,
) -> list[str]:
    """Why `node` does not fit a pod (`requests`: CPU millicores, memory bytes and
    extended resources; `claims`: devices wanted per DRA driver); [] when it fits."""
    selector = spec.get("nodeSelector") or {}
    if any(node.labels.get(k) != v for k, v in selector.items()):
        return [SELECTOR_MISMATCH]
    tolerations = spec.get("tolerations") or []
    for taint in node.taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
            value = taint.get("value", "")
            return [f"node(s) had untolerated taint {{{taint['key']}: {value}}}"]
    found = []
    if node.free("pods") < 1:
        found.append("Too many pods")
    for name, amount in sorted(requests.items()):
        if amount > 0 and amount > node.free(name):
            found.append(f"Insufficient {name}")
    if any(len(node.free_devices.get(d, [])) < n for d, n in claims.items()):
        found.append(CANNOT_ALLOCATE_CLAIMS)
    return found


def score(requests: Mapping[str, int], node: NodeView) -> int:
    """LeastAllocated over CPU and memory, weight 1 each (integer arithmetic)."""
    return least_allocated_score(requests, node.allocatable, node.requested, ("cpu", "memory"))


def pick(
    spec: Mapping[str, Any],
    requests: Mapping[str, int],
    claims: Mapping[str, int],
    nodes: Sequence[NodeView],
) -> tuple[NodeView | None, str]:
    """The node a pod goes to, or None and the scheduler's message."""
    unfit: dict[str, list[str]] = {}
    best: NodeView | None = None
    best_score = -1
    for node in nodes:
        why = reasons(spec, requests, claims, node)
        if why:
            unfit[node.name] = why
            continue
        points = score(requests, node)
        if points > best_score:
            best, best_score = node, points
    if best is None:
        return None, fit_error(len(nodes), unfit)
    return best, ""
