"""Helpers for tests of a running `devplug serve`: its log, its HTTP endpoints; and a
Daemon serving in-process."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

from asyncinotify import Inotify, Mask

from devplug import Daemon, Plugin
from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.ground.channel import unix_channel
from devplug.testing.harness import PluginProcess

TIMEOUT_S = 10.0


def wait_for_output(process: PluginProcess, text: str, count: int = 1) -> str:
    """The process's output once `text` occurs `count` times in it, woken by inotify on
    its log file (AssertionError with the output after TIMEOUT_S)."""
    return wait_for_log(process.log_path, text, count)


def wait_for_log(log: Path, text: str, count: int = 1, timeout: float = TIMEOUT_S) -> str:
    """The text of the `log` file once `text` occurs `count` times in it, woken by
    inotify (AssertionError with the end of the log after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    with Inotify() as inotify:
        inotify.add_watch(log, Mask.MODIFY)
        while True:
            output = log.read_text(errors="replace")
            if output.count(text) >= count:
                return output
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} x{count} not in the output:\n{output[-3000:]}"
            inotify.sync_timeout = left
            inotify.sync_get()  # the next write to the log (None on timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def metric_lines(port: int, prefix: str) -> list[str]:
    status, text = http_get(port, "/metrics")
    assert status == 200
    return [line for line in text.splitlines() if line.startswith(prefix)]


def wait_for_path(path: Path) -> None:
    """Return once `path` exists, woken by inotify on its folder."""
    deadline = time.monotonic() + TIMEOUT_S
    with Inotify() as inotify:
        inotify.add_watch(path.parent, Mask.CREATE | Mask.MOVED_TO)
        while not path.exists():
            left = deadline - time.monotonic()
            assert left > 0, f"{path} did not appear"
            inotify.sync_timeout = left
            inotify.sync_get()


def wait_for_gone(path: Path, timeout: float = TIMEOUT_S) -> None:
    """Return once `path` is gone, woken by inotify on its folder."""
    deadline = time.monotonic() + timeout
    with Inotify() as inotify:
        inotify.add_watch(path.parent, Mask.DELETE | Mask.MOVED_FROM)
        while path.exists():
            left = deadline - time.monotonic()
            assert left > 0, f"{path} is still there"
            inotify.sync_timeout = left
            inotify.sync_get()


class Stubs(dict[str, pb_grpc.DevicePluginStub]):
    """A connected stub per resource, and the in-process daemon behind them."""

    def __init__(self, stop: asyncio.Event, task: asyncio.Task[None]) -> None:
        super().__init__()
        self._stop, self._task = stop, task

    async def shutdown(self) -> None:
        """Stop the daemon with the channels still open: what its streams end with can
        then be read (closing a channel cancels the calls it has not finished)."""
        self._stop.set()
        await asyncio.wait_for(self._task, TIMEOUT_S)


@contextlib.asynccontextmanager
async def serving(plugin_dir: Path, *plugins: Plugin) -> AsyncIterator[Stubs]:
    """Run a Daemon in-process and yield a connected stub per resource; stopped, its
    channels closed, at the end."""
    stop = asyncio.Event()
    stubs = Stubs(stop, asyncio.create_task(Daemon(plugins, plugin_dir).run(stop)))
    channels = {p.resource_name: unix_channel(plugin_dir / p.socket_name) for p in plugins}
    try:
        stubs.update((name, pb_grpc.DevicePluginStub(ch)) for name, ch in channels.items())
        for stub in stubs.values():  # connects once the socket serves: no sleeping
            await stub.GetDevicePluginOptions(pb.Empty(), wait_for_ready=True, timeout=TIMEOUT_S)
        yield stubs
    finally:
        await stubs.shutdown()
        for ch in channels.values():
            await ch.close()
