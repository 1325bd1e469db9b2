"""Which devices a container gets (the kubelet's devicesToAllocate): devices freed by
the init containers before it first, then, within the NUMA nodes the topology
manager chose, the plugin's preferred devices, then the aligned ones, the unaligned
ones and those without NUMA node, in the plugin's listing order.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Protocol

from devplug.simulator import checkpoint, topology
from devplug.simulator.devicestate import AdmissionError, ResourceState
from devplug.simulator.endpoint import EndpointError
from devplug.simulator.pods import ContainerSpec


class DeviceNode(Protocol):
    """What the hints are worked out from: the device manager's resources."""

    resources: dict[str, ResourceState]

    @property
    def numa_nodes(self) -> list[int]: ...

    def is_device_plugin_resource(self, resource: str) -> bool: ...

    def available(self, resource: str) -> list[str]: ...


# preferred(resource, available, must_include, size): GetPreferredAllocation's answer
# ([] when the plugin offers none).
Preferred = Callable[[str, list[str], list[str], int], Awaitable[list[str]]]


async def devices_to_allocate(
    resource: str,
    state: ResourceState | None,
    required: int,
    reusable: list[str],
    available: Callable[[], list[str]],
    hint: topology.TopologyHint | None,
    preferred: Preferred,
) -> list[str]:
    """The devices of `resource` to allocate to one container; AdmissionError (the
    kubelet's wording) when they cannot be had."""
    if state is None:
        raise AdmissionError(f"cannot allocate unregistered device {resource}")
    if not state.healthy:
        raise AdmissionError(
            f"no healthy devices present; cannot allocate unhealthy devices {resource}"
        )
    needed = required
    if needed == 0:
        return []
    allocated: dict[str, None] = {}

    def take(candidates: Iterable[str]) -> bool:
        nonlocal needed
        for device_id in candidates:
            if device_id in allocated:
                continue
            allocated[device_id] = None
            needed -= 1
            if needed == 0:
                return True
        return False

    if take(reusable):
        return list(allocated)
    free = available()
    if len(free) < needed:
        raise AdmissionError(
            f"requested number of devices unavailable for {resource}. "
            f"Requested: {needed}, Available: {len(free)}"
        )
    aligned, unaligned, no_affinity = filter_by_affinity(state, hint, free)
    if needed < len(aligned):
        offer = state.ordered([*aligned, *allocated]) if allocated else aligned
        chosen = await preferred(resource, offer, list(allocated), required)
        aligned_set = set(aligned)
        if take(d for d in chosen if d in aligned_set) or take(aligned):
            return list(allocated)
        raise AdmissionError(
            "unexpectedly allocated less resources than required. "
            f"Requested: {required}, Got: {required - needed}"
        )
    if take(aligned):
        return list(allocated)
    offer = state.ordered([*free, *allocated]) if allocated else free
    chosen = await preferred(resource, offer, list(allocated), required)
    free_set = set(free)
    if take(d for d in chosen if d in free_set) or take(unaligned) or take(no_affinity):
        return list(allocated)
    raise AdmissionError(
        "unexpectedly allocated less resources than required. "
        f"Requested: {required}, Got: {required - needed}"
    )


def filter_by_affinity(
    state: ResourceState, hint: topology.TopologyHint | None, available: list[str]
) -> tuple[list[str], list[str], list[str]]:
    """Split `available` into devices on the chosen NUMA nodes, on other nodes, and
    without NUMA node."""
    if hint is None or hint.affinity is None or not state.has_topology:
        return [], [], list(available)
    topo = state.topology
    per_node: dict[int, set[str]] = {}
    for device_id in available:
        for node in topo.get(device_id) or (checkpoint.NO_NUMA,):
            per_node.setdefault(node, set()).add(device_id)
    mask = hint.affinity

    def rank(node: int) -> tuple[int, int, int]:
        if node == checkpoint.NO_NUMA:
            group = 2
        elif topology.any_set(mask, [node]):
            group = 0
        else:
            group = 1
        return (group, len(per_node[node]), node)

    nodes = sorted(per_node, key=rank)
    aligned: list[str] = []
    unaligned: list[str] = []
    without: list[str] = []
    for device_id in available:
        for node in nodes:
            if device_id in per_node[node]:
                if node == checkpoint.NO_NUMA:
                    without.append(device_id)
                elif topology.any_set(mask, [node]):
                    aligned.append(device_id)
                else:
                    unaligned.append(device_id)
                break
    return aligned, unaligned, without


def topology_hints(
    node: DeviceNode, container: ContainerSpec, reusable: Mapping[str, Mapping[str, None]]
) -> dict[str, list[topology.TopologyHint] | None]:
    """The device manager's hints for one container (GetTopologyHints)."""
    hints: dict[str, list[topology.TopologyHint] | None] = {}
    for resource, requested in container.devices.items():
        if not node.is_device_plugin_resource(resource):
            continue
        state = node.resources.get(resource)
        if state is None or not state.has_topology:
            hints[resource] = None
            continue
        available = node.available(resource)
        reuse = list(reusable.get(resource, {}))
        if len(set(available) | set(reuse)) < requested:
            hints[resource] = []
            continue
        hints[resource] = topology.device_hints(
            node.numa_nodes, state.topology, available, reuse, requested
        )
    return hints


async def preferred(
    resources: Mapping[str, ResourceState],
    resource: str,
    available: list[str],
    must_include: list[str],
    size: int,
) -> list[str]:
    """The plugin's preferred devices (GetPreferredAllocation), [] when it offers none."""
    state = resources.get(resource)
    if state is None:
        raise AdmissionError(f"endpoint not found in cache for a registered resource: {resource}")
    if not state.endpoint.preferred_allocation:
        return []
    try:
        return await state.endpoint.preferred(available, must_include, size)
    except EndpointError as error:
        raise AdmissionError(
            f"device plugin GetPreferredAllocation rpc failed with err: {error}"
        ) from None
