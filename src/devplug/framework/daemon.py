"""Run plugins as a node daemon: discovery, sockets, registration, signals, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from devplug.api.constants import DEVICE_PLUGIN_PATH, KUBELET_SOCKET
from devplug.framework.endpoint import Endpoint
from devplug.framework.generation import Generation
from devplug.framework.plugin import Plugin
from devplug.framework.watchdog import LoopWatchdog
from devplug.ground.signals import stop_on_signals
from devplug.ground.unixserver import StrPath

if TYPE_CHECKING:
    from pathlib import Path

    from devplug.framework.dra.driver import DriverBinding
    from devplug.framework.dra.service import DraSettings
    from devplug.ground.dirwatch import DirWatcher

log = logging.getLogger("devplug.daemon")

FOLDER_RETRY_FIRST_S = 0.5
FOLDER_RETRY_MAX_S = 30.0


class ServiceFailed(RuntimeError):
    """A service cannot do its job (a port in use...): the daemon stops, and the message
    is the one line the operator sees."""


class Service(Protocol):
    """Something that runs beside the plugins for the daemon's lifetime (a file kept in
    step with the devices, a metrics server, a config watcher...).

    `run` is started once every endpoint task exists and cancelled on shutdown; it
    should clean up what it made when cancelled. A failure stops the daemon.
    """

    async def run(self, daemon: Daemon) -> None: ...


@runtime_checkable
class ReadinessReporter(Protocol):
    """A service that has a say in /readyz (the DRA drivers: registered, slices published)."""

    def problems(self) -> list[str]:
        """Why it is not ready; empty when it is."""
        ...


class Daemon:
    """Serves several plugins, each on its own socket, from one process."""

    def __init__(
        self,
        plugins: Sequence[Plugin],
        plugin_dir: StrPath = DEVICE_PLUGIN_PATH,
        *,
        services: Sequence[Service] = (),
    ):
        names = [p.resource_name for p in plugins]
        if len(set(names)) != len(names):
            raise ValueError(f"a resource is served twice: {sorted(names)}")
        # A str, not a Path: pathlib (and what it imports) stays unloaded in a plugin
        # daemon, 0.6 MiB and milliseconds of every start (`make bench`, "floor").
        self._plugin_dir = os.fspath(plugin_dir) or "."
        self._tried = asyncio.Event()  # an endpoint has made its first try
        self.endpoints = [Endpoint(p, self._plugin_dir, self._tried) for p in plugins]
        self._watched = {KUBELET_SOCKET, *(p.socket_name for p in plugins)}
        self.services = list(services)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._plugin_tasks: dict[str, list[asyncio.Task[Any]]] = {}
        self._tasks_changed = asyncio.Event()
        self._plugins_generation = Generation()
        self._watcher: DirWatcher[str] | None = None  # from the first turn of `run`

    @property
    def plugin_dir(self) -> Path:
        from pathlib import Path

        return Path(self._plugin_dir)

    @property
    def plugins(self) -> list[Plugin]:
        return [e.plugin for e in self.endpoints]

    @property
    def plugins_generation(self) -> int:
        """Bumped by every `add` and `remove`: services that write something for each
        plugin (feature file, CDI specs) follow the served set with it."""
        return self._plugins_generation.value

    async def wait_plugins_changed(self, generation: int) -> int:
        """Wait until the plugin set is newer than `generation`; return the new one."""
        return await self._plugins_generation.wait_newer(generation)

    def _on_folder_event(self, folder: str, name: str) -> None:
        if name and name not in self._watched:
            return
        if not name:  # the folder itself went away: recreate it, watch again
            try:
                os.makedirs(self._plugin_dir, mode=0o750, exist_ok=True)
            except OSError as error:
                log.error("cannot create the plugin folder %s: %s", self._plugin_dir, error)
            if self._watcher is not None:
                self._watcher.watch(self._plugin_dir)
        for endpoint in self.endpoints:
            endpoint.wake()

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set or a plugin's scan fails (which is raised)."""
        await _make_folder(self._plugin_dir, stop)
        kubelet = os.path.join(self._plugin_dir, KUBELET_SOCKET)
        if not _exists(kubelet):
            log.info(
                "waiting for the kubelet: no %s yet; the plugins register when it appears", kubelet
            )
        tasks = self._tasks
        for endpoint in self.endpoints:
            self._start_endpoint(endpoint)
        tasks.add(asyncio.create_task(self._watch_folder(), name="dirwatch"))
        for service in self.services:
            tasks.add(asyncio.create_task(service.run(self), name=type(service).__name__))
        stopping = asyncio.create_task(stop.wait())
        watchdog = LoopWatchdog()  # a hook that blocks the loop is said, with its name
        watchdog.start()
        try:
            while True:
                self._tasks_changed.clear()
                changed = asyncio.create_task(self._tasks_changed.wait())
                done, _ = await asyncio.wait(
                    {stopping, changed, *tasks}, return_when=asyncio.FIRST_COMPLETED
                )
                changed.cancel()
                if stopping in done:
                    return
                for task in done - {changed}:
                    if task not in tasks:
                        continue  # a removed plugin's task, ended by remove()
                    tasks.discard(task)
                    task.result()  # a failure stops the daemon; a finished scan is fine
        finally:
            stopping.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.gather(*(e.stop() for e in self.endpoints))
            if self._watcher is not None:
                self._watcher.close()
            watchdog.stop()
            log.info("stopped")

    async def _watch_folder(self) -> None:
        """Watch the folder once an endpoint has made its first try (registered, or no
        kubelet to register with yet), then have every endpoint look again: what
        changed before the watch (a kubelet restarted, a socket wiped) is seen in that
        look, what changes after it comes as an event. inotify's setup (ctypes, ~3 % of
        a start) so runs while the kubelet dials back, not before the Register."""
        await self._tried.wait()
        from devplug.ground.dirwatch import DirWatcher

        self._watcher = watcher = DirWatcher(self._on_folder_event)
        watcher.watch(self._plugin_dir)
        for endpoint in self.endpoints:
            endpoint.wake()
        await watcher.run()

    def _start_endpoint(self, endpoint: Endpoint) -> None:
        started = [
            asyncio.create_task(_scan(endpoint.plugin), name=f"scan {endpoint.name}"),
            asyncio.create_task(endpoint.run(), name=f"serve {endpoint.name}"),
        ]
        self._plugin_tasks[endpoint.name] = started
        self._tasks.update(started)
        self._tasks_changed.set()

    def add(self, plugin: Plugin) -> None:
        """Serve one more plugin while running (a config reload); it registers as soon
        as its scan publishes."""
        if plugin.resource_name in self._plugin_tasks:
            raise ValueError(f"{plugin.resource_name} is served already")
        endpoint = Endpoint(plugin, self._plugin_dir, self._tried)
        self.endpoints.append(endpoint)
        self._watched.add(plugin.socket_name)
        self._start_endpoint(endpoint)
        self._plugins_generation.bump()

    async def remove(self, resource_name: str) -> None:
        """Stop serving one plugin while running: its scan ends, its streams close and
        its socket goes, which tells the kubelet the resource is gone. Others are not
        touched."""
        endpoint = next(e for e in self.endpoints if e.name == resource_name)
        self.endpoints.remove(endpoint)
        self._watched.discard(endpoint.plugin.socket_name)
        self._plugins_generation.bump()
        tasks = self._plugin_tasks.pop(resource_name, [])
        for task in tasks:
            task.cancel()
            self._tasks.discard(task)
        await asyncio.gather(*tasks, return_exceptions=True)
        await endpoint.stop()


async def _make_folder(folder: str, stop: asyncio.Event) -> None:
    """Create the plugin folder if it is missing; while that fails (a read-only or
    unwritable parent), say why and try again with backoff instead of exiting. A path
    that is a file, not a folder, is a mistake no waiting mends: it is raised."""
    delay = FOLDER_RETRY_FIRST_S
    said = None
    while not stop.is_set():
        try:
            os.makedirs(folder, mode=0o750, exist_ok=True)
            if said is not None:
                log.info("created the plugin folder %s", folder)
            return
        except (FileExistsError, NotADirectoryError):
            raise
        except OSError as error:
            cause = error.strerror or str(error)
            log.log(  # the cause once; the same again only at debug level
                logging.DEBUG if cause == said else logging.ERROR,
                "cannot create the plugin folder %s: %s; retrying in %.1f s",
                folder,
                cause,
                delay,
            )
            said = cause
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
        # that lands as the timeout fires, and a SIGTERM then never stops the daemon.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await stop.wait()
        delay = min(delay * 2, FOLDER_RETRY_MAX_S)


def _exists(path: str) -> bool:
    return os.path.exists(path)  # one stat, at start


async def _scan(plugin: Plugin) -> None:
    await plugin.scan()
    if not plugin.published:
        raise RuntimeError(f"{plugin.resource_name}: scan() returned without publishing devices")


def run(
    *plugins: Plugin,
    drivers: Sequence[Plugin | DriverBinding] = (),
    dra: DraSettings | None = None,
    plugin_dir: StrPath = DEVICE_PLUGIN_PATH,
) -> None:
    """Serve `plugins` as device plugins and `drivers` as DRA drivers until SIGTERM or
    SIGINT, then clean up and return. One object in both is served both ways and
    scanned once; `dra` says where the node's DRA folders are (default: the
    kubelet's, this node's name from $NODE_NAME or the host name)."""
    asyncio.run(serve(plugins, plugin_dir, drivers=drivers, dra=dra))


async def serve(
    plugins: Sequence[Plugin],
    plugin_dir: StrPath = DEVICE_PLUGIN_PATH,
    *,
    services: Sequence[Service] = (),
    drivers: Sequence[Plugin | DriverBinding] = (),
    dra: DraSettings | None = None,
) -> None:
    """`run` inside your own event loop (SIGTERM and SIGINT still stop it)."""
    if drivers:
        services = [*services, dra_service(drivers, dra)]
    with stop_on_signals() as stop:
        await Daemon(plugins, plugin_dir, services=services).run(stop)


def dra_service(
    drivers: Sequence[Plugin | DriverBinding], dra: DraSettings | None = None
) -> Service:
    """The service that serves `drivers` through DRA (the DRA modules are imported
    only here, when a driver is served)."""
    from devplug.framework.dra.driver import DriverBinding
    from devplug.framework.dra.service import DraService, DraSettings
    from devplug.framework.names import this_node

    bindings = [d if isinstance(d, DriverBinding) else DriverBinding.of(d) for d in drivers]
    return DraService(bindings, dra if dra is not None else DraSettings(node_name=this_node()))
