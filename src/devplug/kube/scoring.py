"""The kube-scheduler's node score of NodeResourcesFit's default strategy,
LeastAllocated, in its integer arithmetic: written once for the cluster view, the
planner's fit step and the placement policies, so that all three rank nodes as the
scheduler does."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

MAX_NODE_SCORE = 100  # the scheduler's framework.MaxNodeScore


def least_allocated(capacity: int, used: int) -> int:
    """0-100 for one resource: higher the emptier the node is left (`used` includes the
    pod's request); 0 where it has none, or would be over-committed."""
    if capacity <= 0 or used > capacity:
        return 0
    return (capacity - used) * MAX_NODE_SCORE // capacity


def least_allocated_score(
    requests: Mapping[str, int],
    allocatable: Mapping[str, int],
    requested: Mapping[str, int],
    resources: Iterable[str] | None = None,
) -> int:
    """The node's score for a pod: the mean over `resources` (the pod's requested
    resources by default; the scheduler's default config weighs CPU and memory, 1
    each)."""
    names = list(requests if resources is None else resources)
    scores = [
        least_allocated(allocatable.get(n, 0), requested.get(n, 0) + requests.get(n, 0))
        for n in names
    ]
    return sum(scores) // len(scores) if scores else 0
