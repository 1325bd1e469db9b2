"""A plugin in the same process as the simulated kubelet: the device manager's endpoint
without a socket.

Many simulated nodes share one process and one event loop, so a node cannot give
each of its plugins a socket, a gRPC server and a channel. `LocalEndpoint` hands the
device manager's calls to the plugin's own `DevicePluginServicer`, the code that
answers the kubelet on a real node: the same request validation, hooks and refusals,
with the gRPC status a refusal would carry worded as the kubelet prints it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import grpc

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.framework.plugin import Plugin
from devplug.framework.servicer import DevicePluginServicer
from devplug.simulator.endpoint import Endpoint, EndpointError, go_code_name


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details

    def kubelet_text(self) -> str:
        """As grpc-go prints a failed call: `rpc error: code = X desc = message`."""
        return f"rpc error: code = {go_code_name(self.code)} desc = {self.details}"


class _Context:
    """What the servicer asks of a gRPC call context: `abort` ends the call."""

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        raise _Refused(code, details)


class LocalEndpoint(Endpoint):
    """The endpoint of `plugin` on one node: a servicer of its own (stream counts and
    limits are per node, as one connection per kubelet is), the plugin shared."""

    def __init__(self, plugin: Plugin) -> None:
        self.servicer = DevicePluginServicer(plugin)
        self._context: Any = _Context()
        options = pb.DevicePluginOptions(
            pre_start_required=plugin.pre_start_required,
            get_preferred_allocation_available=plugin.preferred_allocation,
        )
        super().__init__(plugin.resource_name, None, None, options)
        self.stop_time = None  # connected from the start: no dial

    @property
    def connected(self) -> bool:
        return self.stop_time is None

    async def list_and_watch(self, on_update: Callable[[Sequence[pb.Device]], None]) -> str:
        try:
            async for response in self.servicer.ListAndWatch(pb.Empty(), self._context):
                on_update(list(response.devices))
        except _Refused as refused:
            return refused.kubelet_text()
        return "stream closed by the plugin"

    def _live(self) -> DevicePluginServicer:
        if self.stop_time is not None:
            raise EndpointError(f"endpoint {self.resource} has been stopped")
        return self.servicer

    async def allocate(self, device_ids: Sequence[str]) -> pb.AllocateResponse:
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=list(device_ids))]
        )
        try:
            return await self._live().Allocate(request, self._context)
        except _Refused as refused:
            raise EndpointError(refused.kubelet_text()) from None

    async def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        try:
            response = await self._live().GetPreferredAllocation(request, self._context)
        except _Refused as refused:
            raise EndpointError(refused.kubelet_text()) from None
        if not response.container_responses:
            return []
        return list(response.container_responses[0].deviceIDs)

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        request = pb.PreStartContainerRequest(devices_ids=list(device_ids))
        try:
            await self._live().PreStartContainer(request, self._context)
        except _Refused as refused:
            raise EndpointError(refused.kubelet_text()) from None

    async def close(self) -> None:
        self.mark_stopped()
        self.servicer.close()
