"""The DRA driver as a daemon service: for each driver, the node plugin on its
sockets and the slice publisher, beside the device plugins of the same daemon.

A plugin served only through DRA is not one of the daemon's device plugins, so the
service runs its scan itself; a plugin served both ways is scanned once, by the
daemon, and read by both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from devplug.api.dra import constants as dra
from devplug.framework.dra.claims import ApiClaims, ClaimSource, FileClaims
from devplug.framework.dra.driver import DriverBinding
from devplug.framework.dra.nodeplugin import NodePlugin
from devplug.framework.dra.prepare import Preparer
from devplug.framework.dra.publisher import FolderSlicePublisher, PoolPublisher

if TYPE_CHECKING:
    from devplug.apiserver.client import KubeApi


class ServingDaemon(Protocol):
    """What the service reads of the daemon that runs it (the plugins it serves itself),
    named here so that the DRA package does not import the daemon, which imports it."""

    @property
    def plugins(self) -> Sequence[object]: ...


log = logging.getLogger("devplug.dra")

# What needs the API server's client, for the one line naming the extra when it is missing.
FEATURE = "the Kubernetes API (DRA, --kubeconfig)"


@dataclass(frozen=True, slots=True)
class DraSettings:
    """Where the node's DRA files are and how the API server is reached."""

    node_name: str
    registry_dir: Path = Path(dra.PLUGINS_REGISTRY_PATH)
    plugins_dir: Path = Path(dra.PLUGINS_PATH)
    cdi_dir: Path = Path(dra.CDI_PATH)
    # A kubeconfig file; None: $KUBECONFIG or the in-cluster service account.
    kubeconfig: str | None = None
    # The kubeconfig's context; None: its current-context.
    context: str | None = None
    # Read claims from this folder instead of the API server, and write the slices
    # there (the kubelet simulator without an API server).
    claims_dir: Path | None = None
    # This pod's UID ($POD_UID from the downward API): in the socket names, so that two
    # devplug pods serve one node side by side during a rolling update, and in the
    # stamp of the slices. Empty: plain socket names (one instance per node).
    pod_uid: str = ""


class DraService:
    """Serves `drivers` through DRA for the daemon's lifetime."""

    def __init__(self, drivers: Sequence[DriverBinding], settings: DraSettings) -> None:
        names = [d.name for d in drivers]
        if len(set(names)) != len(names):
            raise ValueError(f"a DRA driver is served twice: {sorted(names)}")
        self.drivers = list(drivers)
        self.settings = settings
        self.node_plugins: list[NodePlugin] = []
        self.publishers: list[PoolPublisher] = []
        # The daemon's one session to the API server (opened by `run`), handed down.
        self.kube: KubeApi | None = None
        claims: ClaimSource
        if settings.claims_dir is not None:
            claims = FileClaims(settings.claims_dir)
        else:
            from devplug.apiserver.client import KubeApi

            self.kube = KubeApi.from_kubeconfig(
                settings.kubeconfig, settings.context, extra="dra", feature=FEATURE
            )
            claims = ApiClaims(self.kube)
        for driver in self.drivers:
            preparer = Preparer(
                driver,
                settings.node_name,
                claims,
                settings.cdi_dir,
                settings.plugins_dir / driver.name,
            )
            status = None
            if self.kube is not None:
                from devplug.framework.dra.claimstatus import ClaimStatusWriter

                status = ClaimStatusWriter(self.kube, driver.name)
            self.node_plugins.append(
                NodePlugin(
                    preparer,
                    settings.registry_dir,
                    settings.plugins_dir,
                    status=status,
                    pod_uid=settings.pod_uid,
                )
            )
        if self.kube is not None:
            from devplug.framework.dra.publisher import SlicePublisher, publisher_stamp

            stamp = publisher_stamp(settings.pod_uid or _process_identity())
            self.publishers = [
                SlicePublisher(d, settings.node_name, self.kube, stamp) for d in self.drivers
            ]
        elif settings.claims_dir is not None:
            folder = settings.claims_dir
            self.publishers = [
                FolderSlicePublisher(d, settings.node_name, folder) for d in self.drivers
            ]

    def problems(self) -> list[str]:
        """Why DRA is not ready (for /readyz): a driver not registered with the kubelet,
        or its slices not published."""
        found = []
        for node_plugin in self.node_plugins:
            registration = node_plugin.registration
            if not registration.registered.is_set():
                why = f": {registration.error}" if registration.error else ""
                found.append(f"{registration.driver_name}: not registered with the kubelet{why}")
        for publisher in self.publishers:
            found += publisher.problems()
        return found

    async def run(self, daemon: ServingDaemon | None = None) -> None:
        async with contextlib.AsyncExitStack() as stack:
            if self.kube is not None:
                await stack.enter_async_context(self.kube)
            await self._run(daemon)

    async def _run(self, daemon: ServingDaemon | None) -> None:
        served = set(map(id, daemon.plugins)) if daemon is not None else set()
        tasks: list[asyncio.Task[Any]] = []
        for driver in self.drivers:
            if id(driver.plugin) not in served:
                tasks.append(asyncio.create_task(_scan(driver), name=f"scan {driver.name}"))
        # Slices written to the claims folder are there before the driver registers, as
        # a scheduler has them before it allocates; the API server may be away a while.
        first = {id(p.driver): p for p in self.publishers if isinstance(p, FolderSlicePublisher)}
        for node_plugin, driver in zip(self.node_plugins, self.drivers, strict=True):
            serve = _serve(node_plugin, driver, first.get(id(driver)))
            tasks.append(asyncio.create_task(serve, name=driver.name))
        for publisher in self.publishers:
            tasks.append(
                asyncio.create_task(publisher.run(), name=f"slices {publisher.driver.name}")
            )
        try:
            while tasks:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    tasks.remove(task)
                    task.result()  # a failure stops the daemon; a finished scan is fine
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for node_plugin in self.node_plugins:
                if node_plugin.status is not None:
                    await node_plugin.status.close()


def _process_identity() -> str:
    import os
    import socket

    return f"{socket.gethostname()}-{os.getpid()}"


async def _scan(driver: DriverBinding) -> None:
    await driver.plugin.scan()
    if not driver.plugin.published:
        raise RuntimeError(f"{driver.name}: scan() returned without publishing devices")


async def _serve(
    node_plugin: NodePlugin, driver: DriverBinding, slices: PoolPublisher | None = None
) -> None:
    # Registered only once the devices are known, as the device plugins are.
    await driver.plugin.wait_published()
    if slices is not None:
        await slices.wait_published(driver.plugin.generation)
    log.info(
        "%s: serving %s, registration %s",
        driver.name,
        node_plugin.dra_socket,
        node_plugin.registration_socket,
    )
    await node_plugin.run()
