"""Fault scenario 5 (tests/faults.py): a kubelet slow to answer Register, or one that
stops reading its ListAndWatch stream."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

import grpc
from fault_harness import (
    NODE,
    VIRT,
    WAIT_S,
    ListWatcher,
    Outcome,
    Serve,
    Snapshot,
    allocate_request,
    make_nodes,
    new_kubelet,
    node_config,
    restore,
    serving,
    toggle,
    virt_config,
)

from devplug.api.constants import KUBELET_SOCKET
from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.framework.plugin import default_socket_name
from devplug.ground.channel import unix_channel
from devplug.ground.unixserver import UnixServer

# -- 5. a slow or stuck kubelet ------------------------------------------------------------


class HangingRegistration(pb_grpc.RegistrationServicer):
    """A kubelet whose Register never answers."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.changed = asyncio.Event()
        self._never = asyncio.Event()

    async def Register(
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.Empty:
        self.calls.append(request.resource_name)
        self.changed.set()
        await self._never.wait()
        return pb.Empty()

    async def wait_calls(self, count: int) -> None:
        async with asyncio.timeout(WAIT_S):
            while len(self.calls) < count:
                self.changed.clear()
                await self.changed.wait()


async def hanging_register(root: Path, rounds: int) -> Outcome:
    """Register hangs: the call times out (limits.registerTimeoutSeconds), is retried
    with growing delays, Allocate is answered meanwhile, and a real kubelet that comes
    later gets the registration at once."""
    out = Outcome("Register hangs")
    plugin_dir = root / "plugins"
    plugin_dir.mkdir()
    started = time.monotonic()
    limits = "limits:\n  registerTimeoutSeconds: 1\n"  # a loaded real kubelet fits in 1 s
    async with serving(Serve(root, virt_config(3, limits), plugin_dir)) as serve:
        before: Snapshot | None = None
        for round_ in range(1, rounds + 1):
            hanging = HangingRegistration()
            server = UnixServer(
                plugin_dir / KUBELET_SOCKET,
                lambda s, h=hanging: pb_grpc.add_RegistrationServicer_to_server(h, s),
            )
            await server.start()
            await hanging.wait_calls(3)
            async with unix_channel(plugin_dir / default_socket_name(VIRT)) as channel:
                answer = await pb_grpc.DevicePluginStub(channel).Allocate(
                    allocate_request("virt-0"), timeout=WAIT_S, wait_for_ready=True
                )
                out.check(len(answer.container_responses) == 1, "Allocate while Register hangs")
            await server.stop(0)
            async with new_kubelet(root, plugin_dir) as kubelet:
                await kubelet.wait_for_resource(VIRT, count=3, timeout=WAIT_S)
                if before is None:
                    before = await serve.settled()
                else:
                    out.growth = before.growth(await serve.settled(before))
            out.iterations = round_
        lines = await serve.wait_for_log(r"registration refused \(DEADLINE_EXCEEDED\)", 2)
        delays = [float(re.findall(r"retrying in ([0-9.]+) s", line)[0]) for line in lines[:2]]
        out.check(delays[1] > delays[0], f"no backoff between Register attempts: {delays}")
        out.check(serve.running, "the daemon exited")
    out.wall_s = time.monotonic() - started
    return out


def stalled_list_and_watch(socket_path: Path) -> socket.socket:
    """A raw HTTP/2 client that opens ListAndWatch and never reads a byte."""
    import h2.config
    import h2.connection
    import h2.settings

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(os.fspath(socket_path))
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 4096})
    stream = conn.get_next_available_stream_id()
    conn.send_headers(stream, grpc_headers("/v1beta1.DevicePlugin/ListAndWatch"))
    conn.send_data(stream, b"\0\0\0\0\0", end_stream=True)  # one empty message
    sock.sendall(conn.data_to_send())
    return sock


def grpc_headers(path: str) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]


async def stalled_reader(root: Path, flips: int) -> Outcome:
    """ListAndWatch clients that never read while the device list (2,000 devices)
    changes `flips` times: the daemon's memory stays bounded, another reader gets every
    change, Allocate is answered throughout, and what the stalled streams held is
    released with their connections (counted after a warm-up round: gRPC opens one
    fd the first time a stream stalls, and keeps it)."""
    out = Outcome("ListAndWatch client never reads")
    plugin_dir, dev = root / "plugins", root / "dev"
    nodes = make_nodes(dev, 4)
    started = time.monotonic()
    async with (
        new_kubelet(root, plugin_dir) as kubelet,
        serving(Serve(root, node_config(dev, 500), plugin_dir)) as serve,
    ):
        devices = (await kubelet.wait_for_resource(NODE, count=2000, timeout=WAIT_S)).devices
        steady_id = next(d.id for d in devices if "fault1" in d.id)
        socket_path = plugin_dir / default_socket_name(NODE)

        async def stall(count: int) -> None:
            stalled = [stalled_list_and_watch(socket_path) for _ in range(3)]
            try:
                async with ListWatcher(socket_path) as watcher, unix_channel(socket_path) as ch:
                    stub = pb_grpc.DevicePluginStub(ch)
                    for i in range(count):
                        toggle(nodes[0])
                        seen = len(watcher.lists)
                        await watcher.wait(lambda lists, n=seen: len(lists) > n, f"list {i}")
                        if i % 10 == 0:
                            answer = await stub.Allocate(
                                allocate_request(steady_id), timeout=WAIT_S, wait_for_ready=True
                            )
                            out.check(len(answer.container_responses) == 1, f"Allocate {i}")
                    restore(nodes[0])
                    await watcher.wait(lambda lists: all(lists[-1].values()), "the final list")
                    await kubelet.wait_for_resource(NODE, count=2000, timeout=WAIT_S)
            finally:
                for sock in stalled:
                    sock.close()

        await stall(5)
        before = await serve.settled()
        await stall(flips)
        out.iterations = flips
        out.growth = before.growth(await serve.settled(before, probes=20))
        out.check(serve.running, "the daemon exited")
    out.wall_s = time.monotonic() - started
    return out
