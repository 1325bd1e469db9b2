"""The Python floor: a device plugin written straight on grpc.aio, with nothing of
devplug but the generated v1beta1 messages. It serves one resource of `--devices`
virtual devices, registers once with the kubelet, and answers Allocate with the IDs
in one env var, checking only that they are known. `bench/floor.py` runs it beside
the same plugin written on devplug's framework.

    python bench/bare.py PLUGIN_DIR RESOURCE DEVICES
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import grpc

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc

ENV = "BENCH_IDS"
Context = grpc.aio.ServicerContext[Any, Any]


class Bare(pb_grpc.DevicePluginServicer):
    def __init__(self, ids: list[str]) -> None:
        self.ids = set(ids)
        devices = [pb.Device(ID=i, health="Healthy") for i in ids]
        self.listed = pb.ListAndWatchResponse(devices=devices)
        self.stop = asyncio.Event()

    async def GetDevicePluginOptions(self, request: pb.Empty, context: Context) -> Any:
        return pb.DevicePluginOptions()

    async def ListAndWatch(self, request: pb.Empty, context: Context) -> Any:
        yield self.listed
        await self.stop.wait()

    async def Allocate(self, request: pb.AllocateRequest, context: Context) -> Any:
        response = pb.AllocateResponse()
        for container in request.container_requests:
            ids = list(container.devices_ids)
            if not self.ids.issuperset(ids):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unknown device IDs")
            response.container_responses.add(envs={ENV: ",".join(ids)})
        return response

    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Context
    ) -> Any:
        return pb.PreferredAllocationResponse()

    async def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: Context
    ) -> Any:
        return pb.PreStartContainerResponse()


async def main(plugin_dir: str, resource: str, count: int) -> None:
    servicer = Bare([f"dev-{i}" for i in range(count)])
    name = "bare-" + resource.replace("/", "-") + ".sock"
    server = grpc.aio.server()
    pb_grpc.add_DevicePluginServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{os.path.join(plugin_dir, name)}")
    await server.start()
    async with grpc.aio.insecure_channel(f"unix://{plugin_dir}/kubelet.sock") as channel:
        await pb_grpc.RegistrationStub(channel).Register(
            pb.RegisterRequest(version="v1beta1", endpoint=name, resource_name=resource)
        )
    done = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, done.set)
    await done.wait()
    servicer.stop.set()
    await server.stop(1)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
