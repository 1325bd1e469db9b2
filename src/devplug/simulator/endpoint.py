"""The kubelet's client of one registered plugin: dial, options, ListAndWatch, calls.

Errors are turned into the text the kubelet's Go code produces for them (gRPC errors
print as `rpc error: code = InvalidArgument desc = ...`), so that admission messages
read as a kubelet's would.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import stat
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from devplug.api.constants import PRE_START_TIMEOUT_S
from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.ground.channel import FAST_RECONNECT

log = logging.getLogger("devplug.simulator.endpoint")

# The kubelet calls Allocate and GetPreferredAllocation without a deadline; the
# simulator gives up after this long so that a hung plugin cannot hang it.
CALL_TIMEOUT_S = 60.0

_GO_CODE_NAMES = {grpc.StatusCode.CANCELLED: "Canceled", grpc.StatusCode.OK: "OK"}


def go_code_name(code: grpc.StatusCode) -> str:
    """The name grpc-go prints for a status code ("InvalidArgument")."""
    if code in _GO_CODE_NAMES:
        return _GO_CODE_NAMES[code]
    return "".join(part.capitalize() for part in code.name.split("_"))


def go_error_text(code: grpc.StatusCode, details: str) -> str:
    """How grpc-go prints a failed call: `rpc error: code = X desc = message`."""
    return f"rpc error: code = {go_code_name(code)} desc = {details}"


def go_rpc_error(error: grpc.aio.AioRpcError) -> str:
    return go_error_text(error.code(), error.details() or "")


# The requests the device manager sends, one container at a time as the kubelet does;
# built here once for the socket endpoint and the in-process one of a fleet.


def allocate_request(device_ids: Sequence[str]) -> pb.AllocateRequest:
    return pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=list(device_ids))]
    )


def preferred_request(
    available: Sequence[str], must_include: Sequence[str], size: int
) -> pb.PreferredAllocationRequest:
    return pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=list(available),
                must_include_deviceIDs=list(must_include),
                allocation_size=size,
            )
        ]
    )


def preferred_ids(response: pb.PreferredAllocationResponse) -> list[str]:
    """The devices the plugin prefers ([] when it answered nothing)."""
    if not response.container_responses:
        return []
    return list(response.container_responses[0].deviceIDs)


# Why a ListAndWatch stream ended when the plugin ended it itself (status OK): a plugin
# stopping, not a fault.
CLOSED_BY_PLUGIN = "stream closed by the plugin"


class EndpointError(Exception):
    """A call to the plugin failed; the text is the kubelet's wording of the failure."""


class Endpoint:
    """One plugin registered for one resource.

    An endpoint without a channel is a stopped one: what the kubelet keeps for a resource
    restored from its checkpoint until the plugin registers again.
    """

    def __init__(
        self,
        resource: str,
        socket_path: Path | None,
        channel: grpc.aio.Channel | None,
        options: pb.DevicePluginOptions | None,
    ) -> None:
        self.resource = resource
        self.socket_path = socket_path
        self._channel = channel
        self._stub = pb_grpc.DevicePluginStub(channel) if channel is not None else None
        self.options = options
        self.stop_time: float | None = None if channel is not None else time.monotonic()
        self._stream: grpc.aio.UnaryStreamCall[pb.Empty, pb.ListAndWatchResponse] | None = None

    @classmethod
    def stopped(cls, resource: str) -> Endpoint:
        return cls(resource, None, None, None)

    @classmethod
    async def connect(cls, resource: str, socket_path: Path, dial_timeout: float) -> Endpoint:
        """Dial the plugin (blocking, as the kubelet does) and fetch its options."""
        problem = _socket_problem(socket_path)
        if problem is not None:
            raise EndpointError(f"failed to dial device plugin: {problem}")
        channel = grpc.aio.insecure_channel(
            f"unix://{socket_path}",
            options=[*FAST_RECONNECT, ("grpc.default_authority", "localhost")],
        )
        try:
            try:
                await asyncio.wait_for(channel.channel_ready(), dial_timeout)
            except TimeoutError:
                raise EndpointError(
                    "failed to dial device plugin: context deadline exceeded "
                    f"(nothing answered on {socket_path} within {dial_timeout:g} s)"
                ) from None
            stub = pb_grpc.DevicePluginStub(channel)
            try:
                options = await stub.GetDevicePluginOptions(pb.Empty(), timeout=CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError as error:
                raise EndpointError(
                    f"failed to get device plugin options: {go_rpc_error(error)}"
                ) from None
        except BaseException:
            await channel.close()
            raise
        return cls(resource, socket_path, channel, options)

    @property
    def stopped_endpoint(self) -> bool:
        return self.stop_time is not None

    @property
    def connected(self) -> bool:
        return self._channel is not None and self.stop_time is None

    @property
    def pre_start_required(self) -> bool:
        return self.options is not None and self.options.pre_start_required

    @property
    def preferred_allocation(self) -> bool:
        return self.options is not None and self.options.get_preferred_allocation_available

    def mark_stopped(self) -> None:
        if self.stop_time is None:
            self.stop_time = time.monotonic()

    async def list_and_watch(self, on_update: Callable[[Sequence[pb.Device]], None]) -> str:
        """Receive device lists until the stream ends; return why it ended."""
        if self._stub is None:
            return "endpoint has no connection"
        stream = self._stub.ListAndWatch(pb.Empty())
        self._stream = stream
        try:
            async for response in stream:
                on_update(list(response.devices))
        except grpc.aio.AioRpcError as error:
            return go_rpc_error(error)
        finally:
            self._stream = None
        return CLOSED_BY_PLUGIN

    def _check(self) -> pb_grpc.DevicePluginAsyncStub:
        if self._stub is None or self.stop_time is not None:
            raise EndpointError(f"endpoint {self.resource} has been stopped")
        return self._stub

    async def allocate(self, device_ids: Sequence[str]) -> pb.AllocateResponse:
        stub = self._check()
        request = allocate_request(device_ids)
        try:
            response: pb.AllocateResponse = await stub.Allocate(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            raise EndpointError(go_rpc_error(error)) from None
        return response

    async def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        stub = self._check()
        request = preferred_request(available, must_include, size)
        try:
            response = await stub.GetPreferredAllocation(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            raise EndpointError(go_rpc_error(error)) from None
        return preferred_ids(response)

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        stub = self._check()
        try:
            await stub.PreStartContainer(
                pb.PreStartContainerRequest(devices_ids=list(device_ids)),
                timeout=PRE_START_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as error:
            raise EndpointError(go_rpc_error(error)) from None

    async def close(self) -> None:
        """Stop: end the stream, close the connection (calls fail from now on)."""
        self.mark_stopped()
        if self._stream is not None:
            self._stream.cancel()
        channel, self._channel = self._channel, None
        self._stub = None
        if channel is not None:
            with contextlib.suppress(Exception):
                await channel.close()


def _socket_problem(path: Path) -> str | None:
    """Why `path` cannot be a plugin's socket, or None when it may be (or may appear)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return None  # the dial waits for it, as the kubelet's blocking dial does
    except OSError as error:
        return f"{path}: {error.strerror}"
    if not stat.S_ISSOCK(mode):
        return f"{path} is not a socket"
    return None
