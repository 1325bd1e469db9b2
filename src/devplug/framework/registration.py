"""The plugin side of Registration.Register."""

from __future__ import annotations

from pathlib import Path

import grpc

from devplug.api.constants import REGISTER_DIAL_TIMEOUT_S, VERSION
from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc

# kubelet.sock exists from bind(), a moment before the kubelet listens: retry the
# connection quickly instead of gRPC's default 1 s first backoff.
_FAST_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 10),
    ("grpc.min_reconnect_backoff_ms", 10),
    ("grpc.max_reconnect_backoff_ms", 500),
]


async def register(
    kubelet_socket: Path,
    endpoint: str,
    resource_name: str,
    options: pb.DevicePluginOptions,
    *,
    timeout: float = REGISTER_DIAL_TIMEOUT_S + 5,
) -> None:
    """Register with the kubelet; raises grpc.aio.AioRpcError when it refuses."""
    async with grpc.aio.insecure_channel(f"unix://{kubelet_socket}", options=_FAST_RECONNECT) as ch:
        await pb_grpc.RegistrationStub(ch).Register(
            pb.RegisterRequest(
                version=VERSION, endpoint=endpoint, resource_name=resource_name, options=options
            ),
            timeout=timeout,
            wait_for_ready=True,
        )
