"""The simulator's kubelet registers DRA drivers as the kubelet does: it picks the DRA
service and the device health service from the names GetInfo lists, calls the health
service only when it is listed, and refuses a driver with no DRA service it knows."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from devplug.api.drahealth.v1alpha1 import api_pb2 as health
from devplug.api.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from devplug.api.pluginregistration.v1 import api_pb2 as reg
from devplug.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from devplug.ground.unixserver import UnixServer
from devplug.simulator.dra import DRIVER_REFUSED
from tests.dra_helpers import NodeDirs, kubelet_for


class Registration(reg_grpc.RegistrationServicer):
    def __init__(self, name: str, endpoint: Path, versions: Sequence[str]) -> None:
        self.info = reg.PluginInfo(
            type="DRAPlugin", name=name, endpoint=str(endpoint), supported_versions=versions
        )
        self.status: asyncio.Queue[reg.RegistrationStatus] = asyncio.Queue()

    async def GetInfo(self, request: Any, context: Any) -> reg.PluginInfo:
        return self.info

    async def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: Any
    ) -> reg.RegistrationStatusResponse:
        await self.status.put(request)
        return reg.RegistrationStatusResponse()


class Health(health_grpc.DRAResourceHealthServicer):
    """v1alpha1 NodeWatchResources: one device, Unhealthy; counts its callers."""

    def __init__(self) -> None:
        self.calls = 0

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        self.calls += 1
        device = health.DeviceIdentifier(pool_name="node-a", device_name="dev0")
        yield health.NodeWatchResourcesResponse(
            devices=[health.DeviceHealth(device=device, health=health.UNHEALTHY)]
        )
        await asyncio.Event().wait()  # the stream stays open, as a driver's does


@contextlib.asynccontextmanager
async def driver(
    root: Path, name: str, versions: Sequence[str], uid: str = "", endpoint: str = ""
) -> AsyncIterator[tuple[Registration, Health]]:
    """A driver's two sockets: registration in `root`/reg, and its dra.sock with the
    v1alpha1 health service (no claim is prepared here, so no DRA service is needed).
    With `uid`, both socket names carry it, as for one pod of a rolling update."""
    socket = root / "pl" / name / (f"dra-{uid}.sock" if uid else "dra.sock")
    registration = Registration(name, Path(endpoint) if endpoint else socket, versions)
    watch = Health()

    servers = [
        UnixServer(socket, lambda s: health_grpc.add_DRAResourceHealthServicer_to_server(watch, s)),
        UnixServer(
            root / "reg" / (f"{name}-{uid}-reg.sock" if uid else f"{name}-reg.sock"),
            lambda s: reg_grpc.add_RegistrationServicer_to_server(registration, s),
        ),
    ]
    for server in servers:
        await server.start()
    try:
        yield registration, watch
    finally:
        for server in servers:
            await server.stop(0)


async def test_health_and_dra_services_are_chosen_from_the_listed_names(short_tmp: Path) -> None:
    async with kubelet_for(NodeDirs(short_tmp)) as kubelet:
        dra = kubelet.dra
        assert dra is not None
        # The driver's order decides: the first it lists that the kubelet knows.
        listed = ["v1beta1.DRAPlugin", "v1.DRAPlugin", "v1alpha1.DRAResourceHealth"]
        async with driver(short_tmp, "with-health.example.com", listed) as (reg1, watched):
            assert (await reg1.status.get()).plugin_registered
            assert dra.drivers["with-health.example.com"].version == "v1beta1.DRAPlugin"
            # Without v1 listed, the v1alpha1 stream (a driver made for 1.36).
            assert dra.drivers["with-health.example.com"].health_service == (
                "v1alpha1.DRAResourceHealth"
            )
            key = ("with-health.example.com", "node-a", "dev0")
            await kubelet.wait_for(
                lambda: dra.device_health.get(key) == "Unhealthy",
                what="the v1alpha1 health stream followed",
            )
            assert watched.calls == 1

        async with driver(short_tmp, "quiet.example.com", ["v1.DRAPlugin"]) as (reg2, _):
            assert (await reg2.status.get()).plugin_registered
            registered = dra.drivers["quiet.example.com"]
            assert registered.version == "v1.DRAPlugin"
            assert registered.health_task is None  # not listed: never called

        async with driver(short_tmp, "old.example.com", ["1.0.0"]) as (reg3, _):
            status = await reg3.status.get()
            assert not status.plugin_registered
            assert "none of the versions ['1.0.0'] is supported" in status.error
            event = await kubelet.wait_for_event(DRIVER_REFUSED, resource="old.example.com")
            assert "1.0.0" in event.detail
            assert "old.example.com" not in dra.drivers


async def test_instances_of_one_driver_register_side_by_side(short_tmp: Path) -> None:
    """Two pods of a rolling update: both registered, the newer one called; when it
    goes the older is called again; an instance on an endpoint already registered is
    refused, as the kubelet refuses it."""

    async with kubelet_for(NodeDirs(short_tmp)) as kubelet:
        dra = kubelet.dra
        assert dra is not None
        name = "rolling.example.com"
        async with driver(short_tmp, name, ["v1.DRAPlugin"], uid="old") as (old, _):
            assert (await old.status.get()).plugin_registered
            first = dra.drivers[name]
            async with driver(short_tmp, name, ["v1.DRAPlugin"], uid="new") as (new, _):
                assert (await new.status.get()).plugin_registered
                assert dra.drivers[name].endpoint.endswith("dra-new.sock")
                taken = str(short_tmp / "pl" / name / "dra-new.sock")
                async with driver(
                    short_tmp, name, ["v1.DRAPlugin"], uid="thief", endpoint=taken
                ) as (thief, _):
                    refused = await thief.status.get()
                    assert not refused.plugin_registered
                    assert (
                        refused.error
                        == f"endpoint {taken} already registered for DRA driver {name}"
                    )
            await kubelet.wait_for(
                lambda: dra.drivers.get(name) is first, what="the older instance called again"
            )
