"""What the node reports of itself: per resource its devices, their health, NUMA nodes
and holders, and its endpoint; for the node its resources, pods, registration counts
and allocation durations (what `devplug status` and the metrics show).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from devplug.simulator.containermanager import ContainerManager
from devplug.simulator.manager import DeviceManager
from devplug.simulator.podmanager import PodEntry
from devplug.simulator.results import DeviceStatus, NodeStatus, PodSummary, ResourceStatus


def node_status(
    cm: ContainerManager,
    pods: Iterable[PodEntry],
    summaries: Sequence[PodSummary],
    checkpoint_problem: str | None,
) -> NodeStatus:
    """The node's status: its resources, pods, registrations, allocation durations
    and DRA drivers and claims."""
    manager, dra = cm.devices, cm.dra
    names = sorted(manager.resources) if manager is not None else []
    entries = list(pods)
    resources = [s for n in names if (s := resource_status(manager, entries, n)) is not None]
    return NodeStatus(
        resources=resources,
        pods=list(summaries),
        registration_total=dict(sorted(cm.registrar.total.items())),
        registrations=dict(sorted(cm.registrar.done.items())),
        alloc_duration={k: v.snapshot() for k, v in sorted(cm.alloc_durations.items())},
        topology_policy=cm.topology_policy,
        numa_nodes=manager.numa_nodes if manager is not None else list(cm.numa_nodes or []),
        checkpoint_problem=checkpoint_problem,
        dra_drivers=dra.driver_versions() if dra else {},
        dra_claims=dra.claim_status() if dra else [],
    )


def resource_ready(status: ResourceStatus | None, count: int | None, capacity: int | None) -> bool:
    """Whether a resource's plugin is registered and has listed its devices, with
    `count` allocatable (healthy) devices and `capacity` devices if given."""
    return (
        status is not None
        and status.endpoint == "connected"
        and status.listed
        and (count is None or status.allocatable == count)
        and (capacity is None or status.capacity == capacity)
    )


def resource_status(
    manager: DeviceManager | None, pods: Iterable[PodEntry], name: str
) -> ResourceStatus | None:
    """The status of resource `name`; None when it is not (or no longer) known."""
    if manager is None or name not in manager.resources:
        return None
    state = manager.resources[name]
    holders: dict[str, list[str]] = {}
    for entry in pods:
        for container, held in manager.pod_devices.get(entry.spec.uid, {}).items():
            allocation = held.get(name)
            for device_id in allocation.ids() if allocation is not None else ():
                holders.setdefault(device_id, []).append(
                    f"{entry.spec.namespace}/{entry.spec.name}/{container}"
                )
    ids = state.ordered(state.healthy | state.unhealthy | set(state.devices))
    devices = []
    for device_id in ids:
        info = state.devices.get(device_id)
        devices.append(
            DeviceStatus(
                device_id,
                device_id in state.healthy,
                list(info.numa_nodes) if info is not None else [],
                holders.get(device_id, []),
            )
        )
    endpoint = state.endpoint
    return ResourceStatus(
        name=name,
        capacity=state.capacity,
        allocatable=len(state.healthy),
        allocated=len(manager.in_use(name)),
        endpoint="connected" if endpoint.connected else "stopped",
        devices=devices,
        listed=state.listed_by is endpoint and endpoint.connected,
        grace_left_s=manager.grace_left(name),
        pre_start_required=endpoint.pre_start_required,
        preferred_allocation=endpoint.preferred_allocation,
    )
