"""The kubelet's DRA plugin watcher: the drivers that register through sockets in
plugins_registry (GetInfo, then NotifyRegistrationStatus), the newest instance of each
called; their device health streams followed; and, with an API server, the node's
ResourceSlices wiped at start and a grace after the last instance of a driver went.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import stat
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from devplug.ground.channel import unix_channel
from devplug.ground.dirwatch import DirWatcher
from devplug.kube.dranames import driver_name_problem

if TYPE_CHECKING:
    from devplug.apiserver.client import KubeApi

log = logging.getLogger("devplug.simulator.dra")

CALL_TIMEOUT_S = 10.0
# How long the kubelet keeps the slices of a driver that has no instance left.
WIPING_DELAY_S = 30.0
# The DRA services this kubelet speaks.
_VERSIONS: dict[str, tuple[Any, Any]] = {
    dra.V1: (v1, v1_grpc),
    dra.V1BETA1: (v1beta1, v1beta1_grpc),
}
# The device health services this kubelet speaks, the one it prefers first (as a 1.37
# kubelet: v1, else v1alpha1).
_HEALTH_VERSIONS: dict[str, tuple[Any, Any]] = {
    dra.HEALTH_V1: (health_v1, health_v1_grpc),
    dra.HEALTH_V1ALPHA1: (health_v1alpha1, health_v1alpha1_grpc),
}

# Event kinds passed to `on_event(kind, driver, detail)`.
DRIVER_REGISTERED = "dra_driver_registered"
DRIVER_REFUSED = "dra_driver_refused"
DRIVER_REMOVED = "dra_driver_removed"
DEVICE_HEALTH = "dra_device_health"
SLICES_WIPED = "dra_slices_wiped"  # driver: the one wiped ("" at start: all), detail: how


@dataclass(slots=True)
class RegisteredDriver:
    name: str
    endpoint: str
    version: str
    socket: Path  # the registration socket it came from
    channel: grpc.aio.Channel
    stub: Any
    health_task: asyncio.Task[None] | None = None
    # The device health service watched ("v1.DRAResourceHealth"), "" for none.
    health_service: str = ""


class NodeSlices:
    """The kubelet's hold on its node's ResourceSlices: it deletes all of them when it
    starts (no driver is registered yet), and a driver's WIPING_DELAY_S after the last
    instance of it went away (the real kubelet's grace for a driver that restarts)."""

    def __init__(self, api: KubeApi, node: str, wiping_delay: float = WIPING_DELAY_S) -> None:
        self._api = api  # entered by its owner
        self.node = node
        self.wiping_delay = wiping_delay
        self.wiped = 0  # wipes done, for tests

    async def wipe(self, driver: str | None) -> bool:
        """Delete the node's slices (of `driver` only, if given); failures are logged."""
        from devplug.apiserver.client import FAILURES, explain

        selector = f"spec.nodeName={self.node}" + (f",spec.driver={driver}" if driver else "")
        try:
            await self._api.call(
                "DELETE", dra.RESOURCE_SLICES_PATH, params={"fieldSelector": selector}
            )
        except (*FAILURES, ValueError) as error:  # ValueError: an answer that is not JSON
            log.warning("deleting ResourceSlices (%s) failed: %s", selector, explain(error))
            return False
        self.wiped += 1
        log.info("deleted ResourceSlices (%s)", selector)
        return True


class DraPlugins:
    """The registered DRA drivers of the node, from the sockets in `registry_dir`."""

    def __init__(
        self,
        registry_dir: Path,
        *,
        on_event: Callable[[str, str, str], None] | None = None,
        slices: NodeSlices | None = None,
    ) -> None:
        self.registry_dir = registry_dir
        # The driver instances to call: the newest registered of each name. Several
        # instances of one driver (a rolling update) are all registered, by socket.
        self.drivers: dict[str, RegisteredDriver] = {}
        self._instances: dict[str, list[RegisteredDriver]] = {}
        self.slices = slices
        self._wipes: dict[str, asyncio.TimerHandle] = {}
        # (driver, pool, device) -> "Healthy" / "Unhealthy" / "Unknown", from the
        # drivers' health streams (NodeWatchResources), where they offer one.
        self.device_health: dict[tuple[str, str, str], str] = {}
        # The same devices' health messages (why they are unhealthy), where given.
        self.device_health_message: dict[tuple[str, str, str], str] = {}
        self._on_event = on_event or (lambda kind, driver, detail: None)
        self._watcher: DirWatcher[Path] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Register the drivers whose sockets are in the registry folder, and watch it
        for more (as the kubelet's plugin watcher does after a start)."""
        self.registry_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
        watcher = DirWatcher(self._on_folder_event)
        watcher.watch(self.registry_dir)
        self._watcher = watcher
        self._watch_task = asyncio.create_task(watcher.run(), name="plugin watcher")
        if self.slices is not None:
            # At start no driver is registered: the node offers nothing until they are
            # back. In the background, as the kubelet does: it may land after a driver
            # has registered and published again.
            self._spawn(self._wipe(None), "wipe slices")
        for path in sorted(self.registry_dir.iterdir()):
            self._consider(path)

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run `work` in the background; `stop` cancels what is still running."""
        task = asyncio.create_task(work, name=name)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def stop(self) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
            self._watch_task = None
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        for handle in self._wipes.values():
            handle.cancel()
        self._wipes.clear()
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)
        for instances in self._instances.values():
            for driver in instances:
                _cancel(driver)
                await driver.channel.close()
        self._instances.clear()
        self.drivers.clear()

    def _on_folder_event(self, folder: Path, name: str) -> None:
        if name:
            self._consider(folder / name)

    def _consider(self, path: Path) -> None:
        if path.name.startswith("."):
            return  # the kubelet's plugin watcher ignores hidden files (a socket being made)
        try:
            is_socket = stat.S_ISSOCK(path.lstat().st_mode)
        except OSError:
            is_socket = False
        if not is_socket:
            for instances in list(self._instances.values()):
                for driver in [d for d in instances if d.socket == path]:
                    self._deregister(driver)
            return
        self._spawn(self._register(path), f"register {path.name}")

    def _deregister(self, driver: RegisteredDriver) -> None:
        instances = self._instances.get(driver.name, [])
        if driver not in instances:
            return
        instances.remove(driver)
        _cancel(driver)
        log.info("DRA driver %s deregistered (%s removed)", driver.name, driver.socket)
        self._on_event(DRIVER_REMOVED, driver.name, str(driver.socket))
        self._spawn(driver.channel.close(), f"close {driver.name}")
        if instances:
            self.drivers[driver.name] = instances[-1]  # the newest left
            return
        del self._instances[driver.name]
        del self.drivers[driver.name]
        if self.slices is not None:
            # The kubelet's grace for a driver that restarts: its slices go only if no
            # instance of it registers within WIPING_DELAY_S.
            name = driver.name
            loop = asyncio.get_running_loop()
            self._wipes[name] = loop.call_later(
                self.slices.wiping_delay, lambda: self._wipe_driver(name)
            )

    def _wipe_driver(self, name: str) -> None:
        self._wipes.pop(name, None)
        if name not in self.drivers:
            self._spawn(self._wipe(name), f"wipe slices of {name}")

    async def _wipe(self, driver: str | None) -> None:
        assert self.slices is not None
        if await self.slices.wipe(driver):
            how = "the grace after the last instance went" if driver else "the kubelet's start"
            self._on_event(SLICES_WIPED, driver or "", how)

    async def _register(self, socket: Path) -> None:
        async with unix_channel(socket) as channel:
            stub = reg_grpc.RegistrationStub(channel)
            try:
                # The file exists from bind(), a moment before the server listens.
                info = await stub.GetInfo(
                    reg.InfoRequest(), timeout=CALL_TIMEOUT_S, wait_for_ready=True
                )
            except grpc.aio.AioRpcError as error:
                log.warning("GetInfo on %s failed: %s", socket, error.details())
                return
            problem = self._info_problem(info)
            if info.type != dra.DRA_PLUGIN_TYPE:
                return  # a CSI or device plugin: not this manager's
            if problem is None:
                # The first of the driver's list that this kubelet speaks, as the
                # kubelet picks it (the driver's order, not the kubelet's).
                version = next(v for v in info.supported_versions if v in _VERSIONS)
                pb_grpc = _VERSIONS[version][1]
                endpoint = info.endpoint or str(socket)
                instances = self._instances.setdefault(info.name, [])
                for old in [d for d in instances if d.socket == socket]:
                    instances.remove(old)  # the same registration socket served again
                    _cancel(old)
                    await old.channel.close()
                if any(d.endpoint == endpoint for d in instances):
                    problem = f"endpoint {endpoint} already registered for DRA driver {info.name}"
            if problem is None:
                service_channel = unix_channel(endpoint)
                driver = RegisteredDriver(
                    info.name,
                    endpoint,
                    version,
                    socket,
                    service_channel,
                    pb_grpc.DRAPluginStub(service_channel),
                )
                # The health stream is watched only where the driver lists it in its
                # supported_versions, as the kubelet does: v1 where listed, else v1alpha1.
                listed = [v for v in _HEALTH_VERSIONS if v in info.supported_versions]
                if listed:
                    driver.health_service = listed[0]
                    driver.health_task = asyncio.create_task(
                        self._watch_health(driver), name=f"health {info.name}"
                    )
                instances.append(driver)
                self.drivers[info.name] = driver
                wipe = self._wipes.pop(info.name, None)
                if wipe is not None:
                    wipe.cancel()
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.NotifyRegistrationStatus(
                    reg.RegistrationStatus(plugin_registered=problem is None, error=problem or ""),
                    timeout=CALL_TIMEOUT_S,
                )
        if problem is None:
            log.info("DRA driver %s registered (%s, %s)", info.name, version, endpoint)
            self._on_event(DRIVER_REGISTERED, info.name, version)
        else:
            log.warning("DRA driver %s refused: %s", info.name, problem)
            self._on_event(DRIVER_REFUSED, info.name, problem)

    async def _watch_health(self, driver: RegisteredDriver) -> None:
        """Follow the driver's device health stream while it is registered; a driver
        that fails the call (UNIMPLEMENTED too) is simply not watched, as the kubelet does."""
        health, health_grpc = _HEALTH_VERSIONS[driver.health_service]
        stub = health_grpc.DRAResourceHealthStub(driver.channel)
        names = {health.HEALTHY: "Healthy", health.UNHEALTHY: "Unhealthy"}
        try:
            async for message in stub.NodeWatchResources(health.NodeWatchResourcesRequest()):
                for item in message.devices:
                    key = (driver.name, item.device.pool_name, item.device.device_name)
                    state = names.get(item.health, "Unknown")
                    self.device_health_message[key] = item.message
                    if self.device_health.get(key) != state:
                        self.device_health[key] = state
                        self._on_event(DEVICE_HEALTH, driver.name, f"{key[1]}/{key[2]}: {state}")
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.CANCELLED:
                log.info("%s: no device health stream: %s", driver.name, error.code().name)

    @staticmethod
    def _info_problem(info: reg.PluginInfo) -> str | None:
        if problem := driver_name_problem(info.name):
            return problem
        if not any(v in info.supported_versions for v in _VERSIONS):
            return (
                f"none of the versions {list(info.supported_versions)} is supported by the "
                f"kubelet ({', '.join(_VERSIONS)})"
            )
        if info.endpoint and not Path(info.endpoint).is_absolute():
            return f"endpoint {info.endpoint!r} is not an absolute path"
        return None


def _cancel(driver: RegisteredDriver) -> None:
    if driver.health_task is not None:
        driver.health_task.cancel()
