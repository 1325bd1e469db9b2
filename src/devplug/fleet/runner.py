"""A fleet against a real API server: register every node, keep them fresh, and run the
kubelet stand-in of each over the pods the scheduler binds to it.

    async with KubeApi.from_kubeconfig(path) as api:
        runner = FleetRunner(load_fleet("fleet.yaml"), api, work_dir)
        await runner.start()          # Nodes, Leases, ResourceSlices; raises FleetError
        await runner.serve(stop)      # pods, leases, node heartbeats until `stop` is set
        await remove_fleet(api, runner.fleet.name)   # `devplug fleet down`

Everything shares one event loop and one HTTP session: one watch of the bound pods for
all nodes, one task renewing the Leases (spread evenly over the renew interval), one
sending node heartbeats. Writes that fail because the API server is away are retried
until it is back; what each node holds stays in its device manager meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devplug.apiserver.client import STRATEGIC_PATCH, ApiError, KubeApi, Unavailable
from devplug.fleet.calls import LIST_PAGE, FleetCalls
from devplug.fleet.counters import Counters
from devplug.fleet.hardware import PoolHardware, build_pool
from devplug.fleet.node import FleetNode
from devplug.fleet.objects import conditions, now, now_micro
from devplug.fleet.podworkers import WATCH_TIMEOUT_S, PodWorkers
from devplug.fleet.registration import (
    LEASES,
    SLICES,
    existing_nodes,
    register_node,
    remove_fleet,
)
from devplug.fleet.spec import Fleet, Pool
from devplug.framework.generation import Generation

__all__ = [
    "LEASES",
    "LEASE_DURATION_S",
    "LIST_PAGE",
    "RENEW_S",
    "SLICES",
    "STATUS_REPORT_S",
    "WATCH_TIMEOUT_S",
    "Counters",
    "FleetError",
    "FleetRunner",
    "Options",
    "remove_fleet",
]

log = logging.getLogger("devplug.fleet")

LEASE_DURATION_S = 40  # the kubelet's nodeLeaseDurationSeconds
RENEW_S = 10.0  # the kubelet renews at a quarter of the duration
STATUS_REPORT_S = 300.0  # nodeStatusReportFrequency: a heartbeat when nothing changed


class FleetError(Exception):
    """The fleet cannot be started as asked; the message is one line."""


@dataclass
class Options:
    lease_duration_s: int = LEASE_DURATION_S
    renew_s: float = RENEW_S
    status_report_s: float = STATUS_REPORT_S
    # The kubelet settings a capacity run varies: None keeps the pool's.
    topology_policy: str | None = None


class FleetRunner:
    """The fleet's nodes: registered at start, then their pods (PodWorkers), Leases and
    heartbeats served until stopped, over the calls of one session (FleetCalls)."""

    def __init__(
        self, fleet: Fleet, api: KubeApi, folder: Path, options: Options | None = None
    ) -> None:
        self.fleet = fleet
        self.api = api
        self.folder = folder
        self.options = options or Options()
        self.hardware: dict[str, PoolHardware] = {}
        self.nodes: dict[str, FleetNode] = {}
        self.pool_of: dict[str, Pool] = {}
        self.counters = Counters()
        self._node_uids: dict[str, str] = {}
        self._leases: dict[str, dict[str, Any]] = {}
        self.calls = FleetCalls(api)
        # Bumped by every pod decision, relist and failed lease renewal: what to wait on.
        self.changes = Generation()
        # Called with (pod, node, admitted) after each decision: capacity runs follow it.
        self.on_pod: Callable[[Mapping[str, Any], str, bool], None] | None = None
        self.pods = PodWorkers(
            self.calls,
            fleet.name,
            self.nodes,
            self.pool_of,
            self.counters,
            self.changes,
            self._decided,
        )

    def _decided(self, pod: Mapping[str, Any], node: str, admitted: bool) -> None:
        if self.on_pod is not None:
            self.on_pod(pod, node, admitted)

    # -- start ----------------------------------------------------------------------

    async def start(self) -> None:
        """Build the pools, check that no node of the fleet belongs to anyone else, and
        register every node (Node, Lease, ResourceSlices)."""
        started = time.monotonic()
        for pool in self.fleet.pools:
            self.hardware[pool.name] = build_pool(pool, self.folder)
        for pool in self.fleet.pools:
            for name in pool.nodes:
                node = FleetNode(
                    name,
                    self.hardware[pool.name],
                    self.folder,
                    topology_policy=self.options.topology_policy,
                )
                await node.start()
                self.nodes[name] = node
                self.pool_of[name] = pool
        existing = await existing_nodes(self.calls)
        foreign = [n for n in self.nodes if n in existing and existing[n] != self.fleet.name]
        if foreign:
            more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
            raise FleetError(
                f"node {foreign[0]!r}{more} exists and is not part of fleet "
                f"{self.fleet.name!r}: nothing was changed"
            )
        await asyncio.gather(*(self._register(n, n in existing) for n in self.nodes))
        self.counters.register_s = time.monotonic() - started
        log.info(
            "fleet %s: %d nodes registered in %.1f s",
            self.fleet.name,
            len(self.nodes),
            self.counters.register_s,
        )

    async def _register(self, name: str, exists: bool) -> None:
        pool = self.pool_of[name]
        uid, lease = await register_node(
            self.calls,
            self.fleet.name,
            name,
            pool,
            self.hardware[pool.name],
            self.options.lease_duration_s,
            exists,
        )
        self._node_uids[name] = uid
        self._leases[name] = lease
        self.counters.registered += 1

    # -- serving ----------------------------------------------------------------------

    async def serve(self, stop: asyncio.Event) -> None:
        """Run the nodes until `stop` is set."""
        self.calls.stop = stop
        tasks = [
            asyncio.create_task(self.pods.follow(), name="fleet pods"),
            asyncio.create_task(self._renew_leases(), name="fleet leases"),
            asyncio.create_task(self._heartbeats(), name="fleet heartbeats"),
        ]
        stopping = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait([stopping, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stopping:
                    task.result()
        finally:
            for task in [stopping, *tasks]:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.flush(timeout=10.0)
            for node in self.nodes.values():
                await node.stop()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        """Wait until `predicate()` holds, checked after every change."""

        async def wait() -> None:
            seen = self.changes.value
            while not predicate():
                seen = await self.changes.wait_newer(seen)

        await asyncio.wait_for(wait(), timeout)

    async def flush(self, timeout: float) -> None:
        """Wait (up to `timeout`) for the writes in flight."""
        await self.calls.flush(timeout)

    # -- leases and heartbeats ------------------------------------------------------------

    async def _spread(self, period: float, act: Callable[[str], None]) -> None:
        """Call `act(node)` for every node once per `period`, evenly spread over it."""
        names = list(self.nodes)
        loop = asyncio.get_running_loop()
        start = loop.time()
        rounds = 0
        while True:
            rounds += 1
            for index, name in enumerate(names):
                due = start + rounds * period + index * period / len(names)
                ahead = due - loop.time()
                if ahead > 0.005:
                    await asyncio.sleep(ahead)
                act(name)

    async def _renew_leases(self) -> None:
        renewing: dict[str, asyncio.Task[None]] = {}

        def renew(name: str) -> None:
            if name in renewing:  # the last renewal is still waiting for the server
                self.counters.lease_late += 1
                return
            task = asyncio.create_task(self._renew(name))
            renewing[name] = task
            task.add_done_callback(lambda _: renewing.pop(name, None))

        try:
            await self._spread(self.options.renew_s, renew)
        finally:
            # Stopping: the renewals in flight end here, before the session closes.
            in_flight = list(renewing.values())
            for task in in_flight:
                task.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)

    async def _renew(self, name: str) -> None:
        lease = self._leases.get(name)
        if lease is None:
            return
        lease["spec"]["renewTime"] = now_micro()
        path = f"{LEASES}/{name}"
        try:
            async with self.calls.lease_gate:
                try:
                    self._leases[name] = await self.api.call("PUT", path, lease)
                except ApiError as error:
                    if error.status == 404:
                        lease["metadata"].pop("resourceVersion", None)
                        self._leases[name] = await self.calls.put(LEASES, lease)
                    elif error.status == 409:
                        current = await self.api.call("GET", path)
                        current["spec"]["renewTime"] = now_micro()
                        self._leases[name] = await self.api.call("PUT", path, current)
                    else:
                        raise
            self.counters.lease_renewals += 1
        except (ApiError, Unavailable) as error:
            self.counters.lease_failures += 1
            self.changes.bump()
            log.debug("renewing the lease of %s: %s", name, error)

    async def _heartbeats(self) -> None:
        def beat(name: str) -> None:
            # A heartbeat is no transition: the server keeps each lastTransitionTime.
            beats = conditions(now(), "")
            for condition in beats:
                condition.pop("lastTransitionTime")
            patch = {"status": {"conditions": beats}}
            self.calls.write(
                f"heartbeat of node {name}",
                lambda: self.api.call(
                    "PATCH", f"/api/v1/nodes/{name}/status", patch, content_type=STRATEGIC_PATCH
                ),
            )

        await self._spread(self.options.status_report_s, beat)
