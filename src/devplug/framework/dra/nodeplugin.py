"""The DRA node plugin on the wire: the registration socket the kubelet's plugin
watcher finds in plugins_registry, and dra.sock with the DRA service (v1 and v1beta1)
and the device health service (v1 and v1alpha1, one stream each, where the kubelet
calls it).

Both sockets are served again if they vanish; the kubelet's plugin watcher then
finds the registration socket anew and registers the driver again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from devplug.api.dra import constants as dra
from devplug.api.dra.v1 import api_pb2 as v1
from devplug.api.dra.v1 import api_pb2_grpc as v1_grpc
from devplug.api.dra.v1beta1 import api_pb2 as v1beta1
from devplug.api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from devplug.api.drahealth.v1 import api_pb2 as health_v1
from devplug.api.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from devplug.api.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from devplug.api.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from devplug.api.pluginregistration.v1 import api_pb2 as reg
from devplug.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from devplug.framework import observe
from devplug.framework.device import Device
from devplug.framework.dra.claims import ClaimError
from devplug.framework.dra.claimstatus import ClaimStatusWriter, device_data, status_entry
from devplug.framework.dra.driver import ClaimRef
from devplug.framework.dra.prepare import PreparedDevice, Preparer
from devplug.framework.dra.sockets import socket_path
from devplug.ground.dirwatch import DirWatcher
from devplug.ground.unixserver import UnixServer

log = logging.getLogger("devplug.dra.nodeplugin")


def _claim_ref(claim: Any) -> ClaimRef:
    return ClaimRef(claim.namespace, claim.name, claim.uid)


def _tell(kind: str, driver: str, claim: ClaimRef, error: str, started: float) -> None:
    """One event per claim prepared or unprepared (metrics count them by result)."""
    if not observe.heard(logging.DEBUG):
        return
    verb = "prepared" if kind == observe.CLAIM_PREPARED else "unprepared"
    seconds = time.perf_counter() - started
    observe.emit(
        kind,
        driver,
        f"claim {claim.namespace}/{claim.name} " + (f"not {verb}: {error}" if error else verb),
        logging.DEBUG,
        claim=f"{claim.namespace}/{claim.name}",
        result="error" if error else "ok",
        seconds=seconds,
    )


class DraServicer:
    """NodePrepareResources / NodeUnprepareResources for one version's messages."""

    def __init__(
        self, preparer: Preparer, pb: ModuleType, status: ClaimStatusWriter | None = None
    ) -> None:
        self.preparer = preparer
        self.pb = pb
        self.status = status

    def _write_status(self, claim: ClaimRef, devices: Sequence[PreparedDevice]) -> None:
        """The claim's device status: Ready, with what each device is."""
        if self.status is None:
            return
        offers = self.preparer.driver.offers()
        entries = [
            status_entry(
                self.preparer.driver.name,
                d.pool,
                d.device,
                device_data(offers[d.device].device, d.cdi_ids),
                d.share_id,
            )
            for d in devices
            if d.device in offers
        ]
        self.status.ready(claim, entries)

    @staticmethod
    async def _check(claims: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        for claim in claims:
            if not (claim.uid and claim.name and claim.namespace):
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"claim {claim.namespace}/{claim.name} (UID {claim.uid!r}): "
                    "namespace, name and UID are required",
                )

    async def NodePrepareResources(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        await self._check(request.claims, context)
        response = self.pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            entry = response.claims[claim.uid]
            ref = _claim_ref(claim)
            driver = self.preparer.driver.name
            started = time.perf_counter()
            try:
                devices = await self.preparer.prepare(ref)
            except ClaimError as error:
                log.warning("%s: claim %s/%s: %s", driver, claim.namespace, claim.name, error)
                entry.error = str(error)
                _tell(observe.CLAIM_PREPARED, driver, ref, entry.error, started)
                continue
            except OSError as error:  # the CDI spec or the checkpoint cannot be written
                log.exception("%s: claim %s/%s", driver, claim.namespace, claim.name)
                entry.error = f"cannot prepare: {error}"
                _tell(observe.CLAIM_PREPARED, driver, ref, entry.error, started)
                continue
            _tell(observe.CLAIM_PREPARED, driver, ref, "", started)
            self._write_status(ref, devices)
            entry.devices.extend(
                self.pb.Device(
                    request_names=d.requests,
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=d.cdi_ids,
                )
                for d in devices
            )
        return response

    async def NodeUnprepareResources(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        await self._check(request.claims, context)
        response = self.pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            entry = response.claims[claim.uid]
            ref = _claim_ref(claim)
            driver = self.preparer.driver.name
            started = time.perf_counter()
            try:
                await self.preparer.unprepare(ref)
            except ClaimError as error:
                entry.error = str(error)
                _tell(observe.CLAIM_UNPREPARED, driver, ref, entry.error, started)
                continue
            except OSError as error:
                log.exception("%s: claim %s/%s", driver, claim.namespace, claim.name)
                entry.error = f"cannot unprepare: {error}"
                _tell(observe.CLAIM_UNPREPARED, driver, ref, entry.error, started)
                continue
            _tell(observe.CLAIM_UNPREPARED, driver, ref, "", started)
            if self.status is not None:
                self.status.clear(ref)
        return response


class HealthServicer:
    """NodeWatchResources: the health of every device of the pool, on connect and after
    every change, in one version's messages (`pb`: v1 or v1alpha1, the same fields)."""

    def __init__(self, preparer: Preparer, closing: asyncio.Event, pb: ModuleType) -> None:
        self.preparer = preparer
        self._closing = closing
        self.pb = pb

    def _message(self) -> Any:
        pb, now = self.pb, int(time.time())
        return pb.NodeWatchResourcesResponse(
            devices=[
                pb.DeviceHealth(
                    device=pb.DeviceIdentifier(pool_name=self.preparer.pool, device_name=name),
                    health=pb.HEALTHY if offer.device.healthy else pb.UNHEALTHY,
                    last_updated_time=now,
                    message=_health_message(offer.device),
                )
                for name, offer in self.preparer.driver.offers().items()
            ]
        )

    async def NodeWatchResources(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        plugin = self.preparer.driver.plugin
        generation = plugin.generation
        yield self._message()
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            while True:
                changed = asyncio.ensure_future(plugin.wait_changed(generation))
                await asyncio.wait({changed, closing}, return_when=asyncio.FIRST_COMPLETED)
                if not changed.done():
                    changed.cancel()
                    return
                generation = changed.result()
                yield self._message()
        finally:
            closing.cancel()


def _health_message(device: Device) -> str:
    return "" if device.healthy else device.health_reason or "unhealthy"


class RegistrationServicer:
    """GetInfo / NotifyRegistrationStatus for the kubelet's plugin watcher."""

    def __init__(self, driver_name: str, endpoint: Path) -> None:
        self.driver_name = driver_name
        self.endpoint = endpoint
        self.registered = asyncio.Event()
        self.error = ""

    async def GetInfo(
        self, request: reg.InfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=dra.DRA_PLUGIN_TYPE,
            name=self.driver_name,
            endpoint=str(self.endpoint),
            supported_versions=list(dra.SUPPORTED_VERSIONS),
        )

    async def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: grpc.aio.ServicerContext[Any, Any]
    ) -> reg.RegistrationStatusResponse:
        if request.plugin_registered:
            self.error = ""
            self.registered.set()  # before the line: whoever reads it finds it ready
            log.info("%s: registered with the kubelet", self.driver_name)
        else:
            log.error(
                "%s: the kubelet refused the registration: %s", self.driver_name, request.error
            )
            self.error = request.error
            self.registered.clear()
        return reg.RegistrationStatusResponse()


def driver_sockets(
    name: str, registry_dir: Path | str, plugins_dir: Path | str, pod_uid: str = ""
) -> tuple[Path, Path]:
    """A driver's registration socket and its DRA socket (the pod's UID in both names,
    shortened where needed); ValueError, one line, when a folder leaves no room."""
    return (
        socket_path(Path(registry_dir), name, pod_uid, "-reg.sock"),
        socket_path(Path(plugins_dir) / name, "dra", pod_uid, ".sock"),
    )


class NodePlugin:
    """Serves one driver's sockets and keeps them served until cancelled."""

    def __init__(
        self,
        preparer: Preparer,
        registry_dir: Path | str = dra.PLUGINS_REGISTRY_PATH,
        plugins_dir: Path | str = dra.PLUGINS_PATH,
        *,
        status: ClaimStatusWriter | None = None,
        pod_uid: str = "",
    ) -> None:
        self.preparer = preparer
        self.status = status
        name = preparer.driver.name
        # With the pod's UID in both socket names, two devplug pods of a rolling update
        # serve side by side: the kubelet registers both and calls the newer.
        # Where a long driver name and the UID pass the AF_UNIX limit, the UID is
        # shortened to a hash (said once here); a folder too long for any name fails.
        self.registration_socket, self.dra_socket = driver_sockets(
            name, registry_dir, plugins_dir, pod_uid
        )
        for path, full in (
            (self.registration_socket, f"{name}-{pod_uid}-reg.sock"),
            (self.dra_socket, f"dra-{pod_uid}.sock"),
        ):
            if pod_uid and path.name != full:
                log.info("%s: socket %s shortened to %s (AF_UNIX limit)", name, full, path)
        self.registration = RegistrationServicer(name, self.dra_socket)
        self._closing = asyncio.Event()
        self._dra = UnixServer(self.dra_socket, self._add_dra_services)
        self._reg = UnixServer(
            self.registration_socket,
            lambda s: reg_grpc.add_RegistrationServicer_to_server(self.registration, s),  # type: ignore[arg-type]
        )

    def _add_dra_services(self, server: grpc.aio.Server) -> None:
        for pb, pb_grpc in ((v1, v1_grpc), (v1beta1, v1beta1_grpc)):
            pb_grpc.add_DRAPluginServicer_to_server(
                DraServicer(self.preparer, pb, self.status), server
            )
        for pb, pb_grpc in ((health_v1, health_v1_grpc), (health_v1alpha1, health_v1alpha1_grpc)):
            pb_grpc.add_DRAResourceHealthServicer_to_server(
                HealthServicer(self.preparer, self._closing, pb),
                server,
            )

    async def _ensure_served(self) -> None:
        # dra.sock first: the kubelet may dial it as soon as it sees the registration socket.
        for server in (self._dra, self._reg):
            if not server.serving or not server.owns_path():
                if server.serving:
                    log.info(
                        "%s: %s is gone, serving again", self.preparer.driver.name, server.path
                    )
                await server.stop(0)
                await server.start()

    async def run(self) -> None:
        """Serve until cancelled; then stop and remove both sockets."""
        wake = asyncio.Event()
        watcher: DirWatcher[Path] = DirWatcher(lambda folder, name: wake.set())
        try:
            events = asyncio.create_task(watcher.run())
            try:
                while True:
                    wake.clear()
                    # Watch first, then look: a change after the look is an event. A
                    # folder that was removed is made and watched again.
                    for folder in (self.registration_socket.parent, self.dra_socket.parent):
                        folder.mkdir(mode=0o750, parents=True, exist_ok=True)
                        watcher.watch(folder)
                    await self._ensure_served()
                    await wake.wait()
                    if events.done():
                        events.result()
                        raise RuntimeError("the socket folder watcher stopped")
            finally:
                events.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await events
        finally:
            watcher.close()
            await self.stop()

    async def stop(self) -> None:
        self._closing.set()
        await self._reg.stop(0)
        await self._dra.stop(0.5)
