"""gRPC servers on unix sockets, for the kubelet's own sockets."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import grpc

STOP_GRACE_S = 0.5


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.lstat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


class UnixServer:
    """A grpc.aio server listening on one unix socket, which it removes when it stops."""

    def __init__(self, path: Path, add_services: Callable[[grpc.aio.Server], None]) -> None:
        self.path = path
        self._add_services = add_services
        self._server: grpc.aio.Server | None = None
        self._identity: tuple[int, int] | None = None

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        server = grpc.aio.server()
        self._add_services(server)
        umask = os.umask(0o077)
        try:
            server.add_insecure_port(f"unix://{self.path}")
        finally:
            os.umask(umask)
        await server.start()
        self._server = server
        self._identity = _identity(self.path)

    async def stop(self, grace: float = STOP_GRACE_S) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        await server.stop(grace)
        # Remove the socket as Go's listener does on close, unless something else
        # has taken the path meanwhile.
        if self._identity is not None and _identity(self.path) == self._identity:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        self._identity = None

    @property
    def serving(self) -> bool:
        return self._server is not None
