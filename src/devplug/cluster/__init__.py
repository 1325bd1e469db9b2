"""A simulated cluster: N kubelet simulators, each with its own `devplug serve`
process, behind the scheduler's extended-resource fit step.

    from devplug.cluster import Cluster
    from devplug.simulator.pods import parse_pods

    async with Cluster("devices.yaml", nodes=3) as cluster:
        for placement in await cluster.place(parse_pods(pods_yaml)):
            print(placement.pod, placement.status, placement.node, placement.message)

`devplug cluster` is the command on top (see docs/simulator.md).
"""

from devplug.cluster.cluster import (
    ADMITTED,
    REFUSED,
    REJECTED,
    UNSCHEDULABLE,
    Cluster,
    NodeSummary,
    Placement,
    ResourceSummary,
)
from devplug.cluster.nodes import NodeFailed, SimNode
from devplug.cluster.scheduler import (
    Decision,
    NodeState,
    effective_requests,
    fit_error,
    least_allocated_score,
    schedule,
)

__all__ = [
    "ADMITTED",
    "REFUSED",
    "REJECTED",
    "UNSCHEDULABLE",
    "Cluster",
    "Decision",
    "NodeFailed",
    "NodeState",
    "NodeSummary",
    "Placement",
    "ResourceSummary",
    "SimNode",
    "effective_requests",
    "fit_error",
    "least_allocated_score",
    "schedule",
]
