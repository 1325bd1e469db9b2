"""A simulated node: a kubelet simulator and its own `devplug serve` process.

Each node has its own folder (`<folder>/device-plugins` for the plugin sockets, the
simulator's checkpoint and pod list beside it); the plugins run as a real
`devplug serve --config FILE --plugin-dir <folder>/device-plugins` process, so the
node registers its resources the way a node's DaemonSet pod would.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from devplug.ground.process import ChildProcess
from devplug.simulator import Kubelet, ResourceStatus

log = logging.getLogger("devplug.cluster")


def _discard(future: asyncio.Future[Any]) -> None:
    """Cancel `future` and retrieve its outcome whenever it comes."""
    future.cancel()
    future.add_done_callback(lambda f: f.cancelled() or f.exception())


class NodeFailed(Exception):
    """A node did not come up: its plugins exited or did not register in time."""


class SimNode:
    def __init__(
        self,
        name: str,
        folder: Path,
        config: Path,
        *,
        topology_policy: str = "none",
        numa_nodes: int | None = None,
        serve_log_level: str = "warning",
    ) -> None:
        self.name = name
        self.folder = folder
        self.plugin_dir = folder / "device-plugins"
        self.config = config
        self.serve_log_level = serve_log_level
        self.kubelet = Kubelet(
            self.plugin_dir,
            folder,
            topology_policy=topology_policy,
            numa_nodes=numa_nodes,
            control_socket=False,
        )
        self.serve: ChildProcess | None = None

    async def start(self) -> None:
        """Start the kubelet simulator, then `devplug serve` against it."""
        # A cancellation (Ctrl-C) lets the start finish first, so that stop() finds
        # every server it has to stop.
        starting = asyncio.ensure_future(self.kubelet.start())
        try:
            await asyncio.shield(starting)
        except asyncio.CancelledError:
            await starting
            raise
        self.serve = ChildProcess(
            [
                sys.executable,
                "-m",
                "devplug.cli.main",
                "--log-level",
                self.serve_log_level,
                "serve",
                "--config",
                str(self.config),
                "--plugin-dir",
                str(self.plugin_dir),
            ]
        )
        log.info(
            "%s: kubelet simulator in %s, devplug serve pid %d",
            self.name,
            self.folder,
            self.serve.pid,
        )

    async def wait_ready(self, resources: Sequence[str], timeout: float) -> list[ResourceStatus]:
        """Wait until every resource is registered and its devices listed; NodeFailed if
        `devplug serve` exits first or `timeout` seconds pass."""
        serve = self.serve
        if serve is None:
            raise NodeFailed(f"{self.name}: not started")
        waits = asyncio.gather(
            *(self.kubelet.wait_for_resource(r, timeout=timeout) for r in resources)
        )
        waiting: set[asyncio.Future[Any]] = {waits, serve.exited}
        try:
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            _discard(waits)
            raise
        if waits.done():
            try:
                statuses = waits.result()
            except TimeoutError as error:
                raise NodeFailed(f"{self.name}: {error}") from None
            log.info("%s: registered %s", self.name, ", ".join(resources))
            return statuses
        _discard(waits)
        raise NodeFailed(
            f"{self.name}: devplug serve exited with status {serve.returncode} before "
            f"registering {', '.join(resources)}"
        )

    def allocatable(self) -> dict[str, int]:
        """Allocatable (healthy) device count per resource, as the node reports it."""
        return {r.name: r.allocatable for r in self.kubelet.node_status().resources}

    async def stop(self) -> None:
        """Stop the kubelet simulator, then the plugins (SIGTERM, SIGKILL after 10 s)."""
        try:
            await self.kubelet.stop()
        finally:
            if self.serve is not None:
                await self.serve.stop()

    def kill_now(self) -> None:
        """Last resort when the event loop is gone: kill the plugin process."""
        if self.serve is not None:
            self.serve.kill_now()
