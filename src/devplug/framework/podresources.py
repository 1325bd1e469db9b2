"""A client of the kubelet's PodResources API: which pod and container holds each
device, and which devices the kubelet can allocate (the healthy ones).

Blocking calls on a plain grpc channel: used by `devplug status` and by the metrics
server's scrape thread, neither of which runs on the daemon's event loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc

from devplug.api.podresources.v1 import api_pb2 as pr
from devplug.api.podresources.v1 import api_pb2_grpc as pr_grpc
from devplug.ground.channel import FAST_RECONNECT


@dataclass(frozen=True, slots=True)
class Holder:
    """One device allocated to one container."""

    resource: str
    device: str
    namespace: str
    pod: str
    container: str


@dataclass(frozen=True, slots=True)
class NodeDevices:
    allocatable: dict[str, list[str]]  # resource -> device IDs, in the kubelet's order
    holders: list[Holder]


def _unique(ids: Iterable[str]) -> list[str]:
    # The kubelet reports a device once per NUMA node it spans.
    return list(dict.fromkeys(ids))


def _stub(socket: Path | str) -> tuple[grpc.Channel, pr_grpc.PodResourcesListerStub]:
    channel = grpc.insecure_channel(f"unix://{socket}", options=FAST_RECONNECT)
    return channel, pr_grpc.PodResourcesListerStub(channel)


def _holders(response: pr.ListPodResourcesResponse) -> list[Holder]:
    seen: dict[Holder, None] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for entry in container.devices:
                for device in entry.device_ids:
                    holder = Holder(
                        entry.resource_name, device, pod.namespace, pod.name, container.name
                    )
                    seen[holder] = None
    return list(seen)


def list_allocations(socket: Path | str, timeout: float) -> list[Holder]:
    """Every device held by a running container (PodResources List)."""
    channel, stub = _stub(socket)
    with channel:
        return _holders(stub.List(pr.ListPodResourcesRequest(), timeout=timeout))


def node_devices(socket: Path | str, timeout: float) -> NodeDevices:
    """List and GetAllocatableResources, in one connection."""
    channel, stub = _stub(socket)
    with channel:
        allocatable: dict[str, list[str]] = {}
        response = stub.GetAllocatableResources(pr.AllocatableResourcesRequest(), timeout=timeout)
        for entry in response.devices:
            allocatable.setdefault(entry.resource_name, []).extend(entry.device_ids)
        holders = _holders(stub.List(pr.ListPodResourcesRequest(), timeout=timeout))
    return NodeDevices({r: _unique(ids) for r, ids in allocatable.items()}, holders)
