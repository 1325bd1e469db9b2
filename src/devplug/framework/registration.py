"""The plugin side of Registration.Register."""

from __future__ import annotations

from pathlib import Path

from devplug.api.constants import REGISTER_DIAL_TIMEOUT_S, VERSION
from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.framework.channel import unix_channel


async def register(
    kubelet_socket: Path,
    endpoint: str,
    resource_name: str,
    options: pb.DevicePluginOptions,
    *,
    timeout: float = REGISTER_DIAL_TIMEOUT_S + 5,
) -> None:
    """Register with the kubelet; raises grpc.aio.AioRpcError when it refuses, or
    DEADLINE_EXCEEDED when it does not answer within `timeout` (a hung kubelet)."""
    async with unix_channel(kubelet_socket) as ch:
        await pb_grpc.RegistrationStub(ch).Register(
            pb.RegisterRequest(
                version=VERSION, endpoint=endpoint, resource_name=resource_name, options=options
            ),
            timeout=timeout,
            wait_for_ready=True,
        )
