"""The scheduler's step, for extended resources only: which node a pod goes to.

As kube-scheduler's NodeResourcesFit filter does for extended resources, it only
counts: a pod fits a node when, for every extended resource it requests, its
effective request is at most the node's allocatable count minus what the pods already
placed there request. Among the nodes that fit, the one with the highest
least-allocated score wins (NodeResourcesFit's LeastAllocated strategy, over the
extended resources the pod requests, weight 1 each); ties go to the node that comes
first in the cluster's order (node-1, node-2, ...).

A pod that fits no node gets the scheduler's message, a histogram of the reasons:
`0/3 nodes are available: 1 Insufficient example.com/bar, 3 Insufficient example.com/foo.`
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from devplug.kube.fiterror import fit_error as fit_error
from devplug.kube.scoring import least_allocated_score as node_score
from devplug.simulator.pods import effective_requests as effective_requests


@dataclass
class NodeState:
    """What the scheduler knows of a node: allocatable counts (from the node's status)
    and the requests of the pods it placed there."""

    name: str
    allocatable: dict[str, int]
    requested: dict[str, int] = field(default_factory=dict)

    def free(self, resource: str) -> int:
        return self.allocatable.get(resource, 0) - self.requested.get(resource, 0)

    def place(self, requests: Mapping[str, int]) -> None:
        for name, count in requests.items():
            self.requested[name] = self.requested.get(name, 0) + count


def insufficient(requests: Mapping[str, int], node: NodeState) -> list[str]:
    """The filter's reasons for refusing the node, e.g. `Insufficient example.com/foo`."""
    return [
        f"Insufficient {name}"
        for name, count in sorted(requests.items())
        if count > 0 and count > node.free(name)
    ]


def least_allocated_score(requests: Mapping[str, int], node: NodeState) -> int:
    """0-100, higher for a node left emptier by the pod, averaged over its resources
    (integer arithmetic, as the scheduler's)."""
    return node_score(requests, node.allocatable, node.requested)


@dataclass(frozen=True)
class Decision:
    """Where a pod goes (`node`), or why nowhere (`message`)."""

    node: str | None
    requests: dict[str, int]
    # score of each node that fits
    scores: dict[str, int]
    # reasons of each node that does not fit
    unfit: dict[str, list[str]]
    message: str = ""


def schedule(requests: Mapping[str, int], nodes: Sequence[NodeState]) -> Decision:
    """Filter and score `nodes` (in cluster order) for a pod's effective requests."""
    scores: dict[str, int] = {}
    unfit: dict[str, list[str]] = {}
    for node in nodes:
        reasons = insufficient(requests, node)
        if reasons:
            unfit[node.name] = reasons
        else:
            scores[node.name] = least_allocated_score(requests, node)
    if not scores:
        return Decision(None, dict(requests), scores, unfit, fit_error(len(nodes), unfit))
    best = max(scores.values())
    chosen = next(node.name for node in nodes if scores.get(node.name) == best)
    return Decision(chosen, dict(requests), scores, unfit)
