"""One plugin's socket: serve it, keep it registered, serve again after kubelet restarts.

The state is re-derived from the folder on every wake-up (is our socket still ours,
which kubelet.sock did we register with), so any sequence of inotify events, lost or
repeated, ends in the same place: serving and registered with the current kubelet.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING

import grpc

from devplug.api.constants import KUBELET_SOCKET
from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.framework import observe
from devplug.framework.malformed import add_decoding_safely
from devplug.framework.plugin import Plugin
from devplug.framework.registration import NotAnswering, Superseded, register
from devplug.framework.servicer import DevicePluginServicer
from devplug.ground.unixserver import (
    SocketIdentity,
    StrPath,
    UnixServer,
    kubelet_socket_ok,
    socket_identity,
    socket_path_problem,
)

if TYPE_CHECKING:
    from pathlib import Path

log = logging.getLogger("devplug.endpoint")

_RETRY_FIRST_S = 0.5
_RETRY_MAX_S = 30.0
# A kubelet.sock that does not answer: a kubelet that stopped (its next one brings a
# new file, and inotify), or the next one between bind() and listen(): look again soon.
_DIAL_RETRY_FIRST_S = 0.02
STOP_GRACE_S = 1.0


class Endpoint:
    def __init__(self, plugin: Plugin, plugin_dir: StrPath, tried: asyncio.Event) -> None:
        self.plugin = plugin
        # Set once each look at the folder is done (registered, or nothing to register
        # with yet): the daemon's folder watch waits for the first of any endpoint.
        self.tried = tried
        # Paths as str: pathlib stays unloaded in a plugin daemon (see the properties).
        self._plugin_dir = os.fspath(plugin_dir) or "."
        self._socket_path = os.path.join(self._plugin_dir, plugin.socket_name)
        self._kubelet_socket = os.path.join(self._plugin_dir, KUBELET_SOCKET)
        if problem := socket_path_problem(self._socket_path):
            raise ValueError(f"{plugin.resource_name}: {problem}")
        self._server: UnixServer | None = None
        self._servicer: DevicePluginServicer | None = None
        self._registered_to: SocketIdentity | None = None
        self._last_kubelet: SocketIdentity | None = None  # the kubelet registered with last
        self._wake = asyncio.Event()
        self._retry_s = _RETRY_FIRST_S
        self._dial_retry_s = _DIAL_RETRY_FIRST_S
        self._silent: SocketIdentity | None = None  # a kubelet.sock found not answering
        self._retry: asyncio.TimerHandle | None = None
        self._problem: str | None = None  # why the socket cannot be served, said once

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        """Serve and stay registered until cancelled (the plugin must have published)."""
        await self.plugin.wait_published()
        while True:
            self._wake.clear()
            await self._reconcile()
            self.tried.set()
            await self._wake.wait()

    async def _reconcile(self) -> None:
        if self._server is None or not self._server.owns_path():
            if self._server is not None:
                observe.emit(
                    observe.SOCKET_GONE,
                    self.name,
                    f"socket {self._socket_path} is gone, serving again",
                )
            try:
                await self._serve()
            except OSError as error:  # the folder refuses the socket: say why, retry later
                await self._stop_server(grace=0)
                # The cause once at error level; the same cause again only at debug.
                level = logging.DEBUG if str(error) == self._problem else logging.ERROR
                self._problem = str(error)
                log.log(level, "%s: %s; retrying in %.1f s", self.name, error, self._retry_s)
                self._schedule_retry()
                return
            if self._problem is not None:
                log.info("%s: serving %s again", self.name, self._socket_path)
                self._problem = None
            if self._server is None or not self._server.owns_path():
                return  # wiped while starting: its deletion event brings us back here
        kubelet = socket_identity(self._kubelet_socket)
        if kubelet is None:
            if self._registered_to is not None:
                observe.emit(
                    observe.KUBELET_GONE, self.name, "kubelet.sock is gone, waiting for the kubelet"
                )
            self._registered_to = None
            return
        if kubelet == self._registered_to:
            return
        if not kubelet_socket_ok(self._kubelet_socket):
            # A link or plain file named kubelet.sock: never followed out of the folder.
            log.error("%s: %s is not a socket: not registering", self.name, self._kubelet_socket)
            return
        await self._register(kubelet)

    async def _register(self, kubelet: SocketIdentity) -> None:
        started = time.monotonic()
        options = pb.DevicePluginOptions(
            pre_start_required=self.plugin.pre_start_required,
            get_preferred_allocation_available=self.plugin.preferred_allocation,
        )
        server = self._server

        def still_current() -> bool:
            # Connected to this very kubelet.sock, whose kubelet has wiped the folder
            # already: our socket is there now, and stays for its dial back.
            ours = server is not None and server is self._server and server.owns_path()
            return ours and socket_identity(self._kubelet_socket) == kubelet

        try:
            await register(
                self._kubelet_socket,
                self.plugin.socket_name,
                self.plugin.resource_name,
                options,
                still_current=still_current,
                timeout=self.plugin.limits.register_timeout_s,
            )
        except Superseded:
            # Start over from the folder now: not every change that supersedes a try
            # comes with an event (kubelet.sock's inode changed by a chmod, or by the
            # second name of a socket made under a hidden name and linked into place).
            self._wake.set()
            return
        except (NotAnswering, TimeoutError):
            if self._silent != kubelet:
                # A kubelet.sock not tried before: most likely the next kubelet between
                # bind() and listen(), ready in a moment and with no event to come. Look
                # again soon, whatever the dead one before it cost (under load a kubelet
                # takes seconds to start, and the wait had grown meanwhile).
                self._silent = kubelet
                self._dial_retry_s = _DIAL_RETRY_FIRST_S
                observe.emit(
                    observe.KUBELET_GONE,
                    self.name,
                    "kubelet.sock does not answer (its kubelet stopped, or the next is "
                    f"starting): trying again in {self._dial_retry_s:.2f} s",
                    retry_s=self._dial_retry_s,
                )
            self._schedule_retry(dial=True)
            return
        except grpc.aio.AioRpcError as error:
            observe.emit(
                observe.REGISTRATION_FAILED,
                self.name,
                f"registration refused ({error.code().name}): {error.details()}; "
                f"retrying in {self._retry_s:.1f} s",
                logging.WARNING,
                code=error.code().name,
                retry_s=self._retry_s,
            )
            self._schedule_retry()
            return
        self._registered_to = kubelet
        self._retry_s = _RETRY_FIRST_S
        self._dial_retry_s = _DIAL_RETRY_FIRST_S
        self._silent = None
        again = self._last_kubelet is not None
        restart = again and self._last_kubelet != kubelet
        self._last_kubelet = kubelet
        ms = (time.monotonic() - started) * 1000
        observe.emit(
            observe.REGISTERED,
            self.name,
            f"{'re-registered' if again else 'registered'} with the "
            f"{'restarted ' if restart else ''}kubelet as {self.plugin.socket_name} "
            f"in {ms:.1f} ms ({len(self.plugin.devices)} devices)",
            ms=round(ms, 3),
            devices=len(self.plugin.devices),
            again=again,
            kubelet_restart=restart,
        )

    def _schedule_retry(self, dial: bool = False) -> None:
        # Only failures wait; the happy path is driven by inotify alone.
        if self._retry is not None:
            self._retry.cancel()
        delay = self._dial_retry_s if dial else self._retry_s
        self._retry = asyncio.get_running_loop().call_later(delay, self._wake.set)
        if dial:
            self._dial_retry_s = min(delay * 2, _RETRY_MAX_S)
        else:
            self._retry_s = min(delay * 2, _RETRY_MAX_S)

    async def _serve(self) -> None:
        await self._stop_server(grace=0)
        servicer = DevicePluginServicer(self.plugin)
        server = UnixServer(
            self._socket_path,
            lambda s: add_decoding_safely(pb_grpc.add_DevicePluginServicer_to_server, servicer, s),
            self.plugin.limits.server_options(),
        )
        self._server, self._servicer = server, servicer  # first: stop() reaches it
        await server.start()
        self._registered_to = None  # the kubelet knows only the old socket

    async def _stop_server(self, grace: float) -> None:
        server, servicer = self._server, self._servicer
        self._server = self._servicer = None
        if servicer is not None:
            servicer.close()
        if server is not None:
            await server.stop(grace)

    async def stop(self) -> None:
        """Close streams, stop serving, remove our socket (if it is still ours)."""
        if self._retry is not None:
            self._retry.cancel()
        await self._stop_server(grace=STOP_GRACE_S)

    @property
    def plugin_dir(self) -> Path:
        from pathlib import Path

        return Path(self._plugin_dir)

    @property
    def socket_path(self) -> Path:
        from pathlib import Path

        return Path(self._socket_path)

    @property
    def kubelet_socket(self) -> Path:
        from pathlib import Path

        return Path(self._kubelet_socket)

    @property
    def registered(self) -> bool:
        """Registered with the kubelet whose socket is in the folder now."""
        return self._registered_to is not None

    @property
    def streams(self) -> int:
        """ListAndWatch streams open on the socket served now."""
        return self._servicer.streams if self._servicer is not None else 0

    @property
    def name(self) -> str:
        return self.plugin.resource_name
