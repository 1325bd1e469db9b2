"""A plugin or a DRA driver in the same process as the simulated kubelet: the device
manager's endpoint and the DRA manager's, without a socket.

Many simulated nodes share one process and one event loop, so a node cannot give
each of its plugins a socket, a gRPC server and a channel. `LocalEndpoint` hands the
device manager's calls to the plugin's own `DevicePluginServicer`, the code that
answers the kubelet on a real node: the same request validation, hooks and refusals,
with the gRPC status a refusal would carry worded as the kubelet prints it.
`LocalDraEndpoint` hands NodePrepareResources and NodeUnprepareResources to the
driver's `Preparer`, the code its DRA service runs, with a refusal worded as the
error field of the driver's answer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

import grpc

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.framework.dra.claims import ClaimError
from devplug.framework.dra.driver import ClaimRef
from devplug.framework.dra.prepare import Preparer
from devplug.framework.plugin import Plugin
from devplug.framework.servicer import DevicePluginServicer
from devplug.simulator.draendpoint import (
    CdiByRequest,
    DraEndpoint,
    PrepareError,
    add_devices,
    refused,
)
from devplug.simulator.endpoint import (
    CLOSED_BY_PLUGIN,
    Endpoint,
    EndpointError,
    allocate_request,
    go_error_text,
    preferred_ids,
    preferred_request,
)


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details

    def kubelet_text(self) -> str:
        return go_error_text(self.code, self.details)


@contextlib.contextmanager
def _as_kubelet_error() -> Iterator[None]:
    """A refusal of the servicer as the EndpointError a failed gRPC call would give."""
    try:
        yield
    except _Refused as refused:
        raise EndpointError(refused.kubelet_text()) from None


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
        return CLOSED_BY_PLUGIN

    def _live(self) -> DevicePluginServicer:
        if self.stop_time is not None:
            raise EndpointError(f"endpoint {self.resource} has been stopped")
        return self.servicer

    async def allocate(self, device_ids: Sequence[str]) -> pb.AllocateResponse:
        with _as_kubelet_error():
            return await self._live().Allocate(allocate_request(device_ids), self._context)

    async def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        request = preferred_request(available, must_include, size)
        with _as_kubelet_error():
            response = await self._live().GetPreferredAllocation(request, self._context)
        return preferred_ids(response)

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        request = pb.PreStartContainerRequest(devices_ids=list(device_ids))
        with _as_kubelet_error():
            await self._live().PreStartContainer(request, self._context)

    async def close(self) -> None:
        self.mark_stopped()
        self.servicer.close()


class LocalDraEndpoint(DraEndpoint):
    """A DRA driver's `Preparer` (its pool on one node), called as over its socket."""

    def __init__(self, preparer: Preparer) -> None:
        super().__init__(preparer.driver.name)
        self.preparer = preparer

    async def prepare(self, claim: ClaimRef) -> CdiByRequest:
        try:
            devices = await self.preparer.prepare(claim)
        except ClaimError as error:
            raise refused(self.name, claim, str(error)) from None
        except OSError as error:  # the CDI spec or the checkpoint cannot be written
            raise refused(self.name, claim, f"cannot prepare: {error}") from None
        by_request: CdiByRequest = {}
        for device in devices:
            add_devices(by_request, device.requests, device.cdi_ids)
        return by_request

    async def unprepare(self, claim: ClaimRef) -> None:
        try:
            await self.preparer.unprepare(claim)
        except ClaimError as error:
            raise PrepareError(f"{self.name}: unprepare of {claim.name}: {error}") from None
        except OSError as error:
            message = f"{self.name}: unprepare of {claim.name}: cannot unprepare: {error}"
            raise PrepareError(message) from None
