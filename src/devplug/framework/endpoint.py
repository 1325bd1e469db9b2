"""One plugin's socket: serve it, keep it registered, serve again after kubelet restarts.

The state is re-derived from the folder on every wake-up (is our socket still ours,
which kubelet.sock did we register with), so any sequence of inotify events, lost or
repeated, ends in the same place: serving and registered with the current kubelet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path

import grpc

from devplug.api.constants import KUBELET_SOCKET
from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.framework.plugin import Plugin
from devplug.framework.registration import register
from devplug.framework.servicer import DevicePluginServicer

log = logging.getLogger("devplug.endpoint")

# sun_path holds 108 bytes, the terminating NUL included.
MAX_SOCKET_PATH = 107
_RETRY_FIRST_S = 0.5
_RETRY_MAX_S = 30.0
STOP_GRACE_S = 1.0


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class Endpoint:
    def __init__(self, plugin: Plugin, plugin_dir: Path) -> None:
        self.plugin = plugin
        self.plugin_dir = plugin_dir
        self.socket_path = plugin_dir / plugin.socket_name
        self.kubelet_socket = plugin_dir / KUBELET_SOCKET
        self.registrations = 0
        if len(os.fsencode(self.socket_path)) > MAX_SOCKET_PATH:
            raise ValueError(
                f"{plugin.resource_name}: socket path {self.socket_path} is longer than "
                f"{MAX_SOCKET_PATH} bytes, the limit of unix sockets; use a shorter plugin "
                "folder or socket name"
            )
        self._server: grpc.aio.Server | None = None
        self._servicer: DevicePluginServicer | None = None
        self._socket_id: tuple[int, int, int] | None = None
        self._registered_to: tuple[int, int, int] | None = None
        self._wake = asyncio.Event()
        self._retry_s = _RETRY_FIRST_S
        self._retry: asyncio.TimerHandle | None = None

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        """Serve and stay registered until cancelled (the plugin must have published)."""
        await self.plugin.wait_published()
        while True:
            self._wake.clear()
            await self._reconcile()
            await self._wake.wait()

    async def _reconcile(self) -> None:
        socket = _identity(self.socket_path)
        if self._server is None or socket is None or socket != self._socket_id:
            if self._server is not None:
                log.info("%s: socket %s is gone, serving again", self.name, self.socket_path)
            await self._serve()
            if self._socket_id is None:
                return  # wiped while starting: its deletion event brings us back here
        kubelet = _identity(self.kubelet_socket)
        if kubelet is None:
            if self._registered_to is not None:
                log.info("%s: kubelet.sock is gone, waiting for the kubelet", self.name)
            self._registered_to = None
            return
        if kubelet == self._registered_to:
            return
        await self._register(kubelet)

    async def _register(self, kubelet: tuple[int, int, int]) -> None:
        started = time.monotonic()
        options = pb.DevicePluginOptions(
            pre_start_required=self.plugin.pre_start_required,
            get_preferred_allocation_available=self.plugin.preferred_allocation,
        )
        try:
            await register(
                self.kubelet_socket, self.plugin.socket_name, self.plugin.resource_name, options
            )
        except grpc.aio.AioRpcError as error:
            log.warning(
                "%s: registration refused (%s): %s; retrying in %.1f s",
                self.name,
                error.code().name,
                error.details(),
                self._retry_s,
            )
            self._schedule_retry()
            return
        self._registered_to = kubelet
        self.registrations += 1
        self._retry_s = _RETRY_FIRST_S
        log.info(
            "%s: registered with the kubelet as %s in %.1f ms (%d devices)",
            self.name,
            self.plugin.socket_name,
            (time.monotonic() - started) * 1000,
            len(self.plugin.devices),
        )

    def _schedule_retry(self) -> None:
        # Only failures wait; the happy path is driven by inotify alone.
        if self._retry is not None:
            self._retry.cancel()
        self._retry = asyncio.get_running_loop().call_later(self._retry_s, self._wake.set)
        self._retry_s = min(self._retry_s * 2, _RETRY_MAX_S)

    async def _serve(self) -> None:
        await self._stop_server(grace=0)
        self.plugin_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = grpc.aio.server()
        servicer = DevicePluginServicer(self.plugin)
        pb_grpc.add_DevicePluginServicer_to_server(servicer, server)
        # The socket is created by bind() inside add_insecure_port: the umask makes it
        # 0600 from the first moment, not only after a chmod.
        umask = os.umask(0o177)
        try:
            server.add_insecure_port(f"unix://{self.socket_path}")
        finally:
            os.umask(umask)
        await server.start()
        self._server, self._servicer = server, servicer
        # The kubelet may wipe the folder at any moment, this one included: a socket
        # gone already leaves _socket_id None, and its deletion event serves again.
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.chmod(0o600)
        self._socket_id = _identity(self.socket_path)
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
        ours = self._socket_id is not None and _identity(self.socket_path) == self._socket_id
        await self._stop_server(grace=STOP_GRACE_S)
        if ours:
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()

    @property
    def name(self) -> str:
        return self.plugin.resource_name
