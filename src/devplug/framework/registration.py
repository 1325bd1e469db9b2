"""The plugin side of Registration.Register, sent only through a connection made to the
kubelet.sock the caller checked.

A kubelet killed with SIGKILL leaves its kubelet.sock behind; the next one wipes the
folder's sockets (ours too), then binds a new kubelet.sock at the same path. A Register
that waits for the channel to become ready would cross from the dead socket to the new
one and reach the new kubelet unchecked, while our socket may have just been wiped:
the kubelet then dials a missing socket for 10 s, or counts one registration too many.
So the channel is connected first, the caller's checks run on that connection (the
same kubelet.sock, our socket still ours), and only then is the request sent, without
waiting for a reconnection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc

from devplug.api.constants import REGISTER_DIAL_TIMEOUT_S, VERSION
from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.ground.channel import unix_channel
from devplug.ground.unixserver import StrPath

CONNECT_TIMEOUT_S = 5.0


class NotAnswering(Exception):
    """Nothing accepts connections on kubelet.sock: its kubelet stopped (the file stays
    after a SIGKILL), or the next one has bound it and is not listening yet."""


class Superseded(Exception):
    """What the caller checked changed while connecting: nothing was sent."""


async def connect(channel: grpc.aio.Channel, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Connect `channel` once: returns when READY, NotAnswering at the first failure."""
    ready = grpc.ChannelConnectivity.READY
    failed = (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN)
    state = channel.get_state(try_to_connect=True)
    async with asyncio.timeout(timeout):
        while state != ready:
            if state in failed:
                raise NotAnswering
            await channel.wait_for_state_change(state)
            state = channel.get_state(try_to_connect=True)


async def register(
    kubelet_socket: StrPath,
    endpoint: str,
    resource_name: str,
    options: pb.DevicePluginOptions,
    *,
    still_current: Callable[[], bool] = lambda: True,
    timeout: float = REGISTER_DIAL_TIMEOUT_S + 5,
) -> None:
    """Register with the kubelet on `kubelet_socket` once connected and `still_current()`
    holds (else Superseded, nothing sent). NotAnswering when nothing accepts the
    connection (TimeoutError when it hangs); grpc.aio.AioRpcError when the kubelet
    refuses, or DEADLINE_EXCEEDED when it does not answer within `timeout`."""
    async with unix_channel(kubelet_socket) as channel:
        await connect(channel)
        if not still_current():
            raise Superseded
        await pb_grpc.RegistrationStub(channel).Register(
            pb.RegisterRequest(
                version=VERSION, endpoint=endpoint, resource_name=resource_name, options=options
            ),
            timeout=timeout,
        )
