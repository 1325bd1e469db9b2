"""The PodResources API v1 (List, GetAllocatableResources, Get) as the kubelet serves it.

Devices are reported one entry per device and NUMA node, each with that single node
as its topology (devices without a NUMA node come without topology), which is how the
kubelet flattens its per-NUMA allocation records. List and Get report the app
containers and the restartable init containers (sidecars), not the other init
containers. Get for an unknown pod fails as the kubelet's does: a plain error
(status UNKNOWN) saying `pod NAME in namespace NS not found`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import grpc

from devplug.api.podresources.v1 import api_pb2 as pr
from devplug.api.podresources.v1 import api_pb2_grpc as pr_grpc
from devplug.simulator.checkpoint import NO_NUMA
from devplug.simulator.manager import Allocation, DeviceInfo
from devplug.simulator.pods import PodSpec


class PodsProvider(Protocol):
    """The pods the node runs (the kubelet's pod manager)."""

    def active_pods(self) -> Sequence[PodSpec]: ...

    def find_pod(self, name: str, namespace: str) -> PodSpec | None: ...


class DevicesProvider(Protocol):
    """The devices the node has and holds (the kubelet's container manager)."""

    def allocations(self, pod_uid: str, container: str) -> Mapping[str, Allocation]: ...

    def allocatable_devices(self) -> Mapping[str, Sequence[DeviceInfo]]: ...


def _entries(
    resource: str, devices: Iterable[tuple[str, Sequence[int]]]
) -> list[pr.ContainerDevices]:
    result = []
    for device_id, nodes in devices:
        real = [n for n in nodes if n != NO_NUMA]
        if not real:
            result.append(pr.ContainerDevices(resource_name=resource, device_ids=[device_id]))
            continue
        for node in real:
            result.append(
                pr.ContainerDevices(
                    resource_name=resource,
                    device_ids=[device_id],
                    topology=pr.TopologyInfo(nodes=[pr.NUMANode(ID=node)]),
                )
            )
    return result


def _allocation_devices(resource: str, allocation: Allocation) -> list[pr.ContainerDevices]:
    nodes: dict[str, list[int]] = {}
    for node in sorted(allocation.numa):
        for device_id in allocation.numa[node]:
            nodes.setdefault(device_id, []).append(node)
    return _entries(resource, nodes.items())


class PodResourcesServicer(pr_grpc.PodResourcesListerServicer):
    def __init__(self, pods: PodsProvider, devices: DevicesProvider) -> None:
        self._pods = pods
        self._devices = devices

    def _pod(self, pod: PodSpec) -> pr.PodResources:
        containers = [c for c in pod.init_containers if c.restartable] + list(pod.containers)
        result = pr.PodResources(name=pod.name, namespace=pod.namespace)
        for container in containers:
            entry = result.containers.add(name=container.name)
            held = self._devices.allocations(pod.uid, container.name)
            for resource in sorted(held):
                entry.devices.extend(_allocation_devices(resource, held[resource]))
        return result

    async def List(
        self,
        request: pr.ListPodResourcesRequest,
        context: grpc.aio.ServicerContext[pr.ListPodResourcesRequest, pr.ListPodResourcesResponse],
    ) -> pr.ListPodResourcesResponse:
        return pr.ListPodResourcesResponse(
            pod_resources=[self._pod(p) for p in self._pods.active_pods()]
        )

    async def GetAllocatableResources(
        self,
        request: pr.AllocatableResourcesRequest,
        context: grpc.aio.ServicerContext[
            pr.AllocatableResourcesRequest, pr.AllocatableResourcesResponse
        ],
    ) -> pr.AllocatableResourcesResponse:
        response = pr.AllocatableResourcesResponse()
        for resource, devices in sorted(self._devices.allocatable_devices().items()):
            response.devices.extend(_entries(resource, ((d.id, d.numa_nodes) for d in devices)))
        return response

    async def Get(
        self,
        request: pr.GetPodResourcesRequest,
        context: grpc.aio.ServicerContext[pr.GetPodResourcesRequest, pr.GetPodResourcesResponse],
    ) -> pr.GetPodResourcesResponse:
        pod = self._pods.find_pod(request.pod_name, request.pod_namespace)
        if pod is None:
            await context.abort(
                grpc.StatusCode.UNKNOWN,
                f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
            )
        assert pod is not None
        return pr.GetPodResourcesResponse(pod_resources=self._pod(pod))
