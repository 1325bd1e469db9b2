"""The node's side of the scheduler extender (`replicaPolicy: extender`).

Two jobs, one API client:
- publish the node's GPUs (devplug.placement.inventory) as an annotation on its Node,
  again after every change of the devices (health, config reload), so the extender
  sees each GPU's capacity, model, MIG layout, NVLink group and NUMA node;
- tell the plugin which GPU the pod being admitted was given by the extender. The
  kubelet's GetPreferredAllocation carries no pod, but the kubelet admits the pods of
  its node one at a time, oldest first: the pod is the oldest one bound to this node,
  not running yet, with the extender's choice and not yet given, that asks for this
  many devices of the resource. Once allocated it is marked given (annotation, and at
  once in memory) so that the next request matches the next pod.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from devplug.apiserver.backoff import Backoff
from devplug.config.nvidia import MILLI, share_milli
from devplug.kube.requests import pod_requests
from devplug.outputs.follow import follow
from devplug.placement.inventory import (
    ASSIGNED,
    GIVEN,
    INVENTORY,
    Gpu,
    Inventory,
    ids,
    join,
    nvlink_groups,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from devplug.config.nvidia import NvidiaSpec
    from devplug.framework.daemon import Daemon
    from devplug.framework.device import Device
    from devplug.framework.plugin import Plugin
    from devplug.sources.nvidia.source import GpuSource

log = logging.getLogger("devplug.sources.nvidia.extender")

RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0


class Placements(Protocol):
    """Who tells a plugin served with `replicaPolicy: extender` which pod a request is
    for: the node's ExtenderAgent, or a simulated node that knows the pod it admits."""

    async def match(self, resource: str, size: int) -> Match | None: ...

    def given(self, match: Match, gpus: Sequence[str]) -> None: ...


class SharesPlugin(Protocol):
    """What this service needs of a plugin served with `replicaPolicy: extender` (the
    NVIDIA plugin, which imports this module)."""

    resource: str
    resource_name: str
    source: GpuSource
    nvidia: NvidiaSpec
    placements: Placements | None

    @property
    def devices(self) -> Mapping[str, Device]: ...


@dataclass(frozen=True, slots=True)
class Match:
    """The pod a request is for, and the GPUs (IDs) the extender chose for it."""

    namespace: str
    name: str
    uid: str
    gpus: tuple[str, ...]

    @property
    def pod(self) -> str:
        return f"{self.namespace}/{self.name}"


def uses_extender(plugin: Plugin) -> bool:
    spec = getattr(plugin, "nvidia", None)
    return spec is not None and getattr(spec, "replica_policy", "") == "extender"


def inventory(plugin: SharesPlugin) -> Inventory:
    """What `plugin` serves, GPU by GPU, as the extender reads it."""
    source = plugin.source
    units = [u for u in source.units if u.resource == plugin.resource]
    view = source.view
    indexes = [u.gpu.index for u in units]
    size = max(indexes, default=-1) + 1
    links = [pair for pair, count in (view.nvlinks if view else {}).items() if count > 0]
    groups = nvlink_groups(size, links)
    by_uuid: dict[str, bool] = {}
    for device in plugin.devices.values():
        uuid = str(device.attributes.get("uuid", ""))
        by_uuid[uuid] = by_uuid.get(uuid, True) and device.healthy
    gpus = []
    for unit in units:
        gpus.append(
            Gpu(
                id=unit.uuid,
                model=unit.gpu.model,
                milli=MILLI,
                healthy=by_uuid.get(unit.uuid, False),
                mig=tuple(m.profile for m in unit.gpu.migs),
                nvlink=groups[unit.gpu.index],
                numa=-1 if unit.numa is None else unit.numa,
            )
        )
    return Inventory(plugin.resource_name, share_milli(plugin.nvidia, plugin.resource), tuple(gpus))


class ExtenderAgent:
    """A daemon service for the plugins served with `replicaPolicy: extender`."""

    def __init__(self, node: str, kubeconfig: str | None = None) -> None:
        """ValueError (one line) when no kubeconfig or in-cluster account can be used;
        MissingExtra without the client's HTTP library."""
        from devplug.apiserver.client import KubeApi

        self.node = node
        self._api = KubeApi.from_kubeconfig(
            kubeconfig, extra="dra", feature="the Kubernetes API (DRA, --kubeconfig)"
        )
        self._given: set[str] = set()  # pod UIDs given here, before their annotation lands
        self._marks: set[asyncio.Task[None]] = set()  # the pods' annotations on their way
        self._latest = ""  # the inventory to publish
        self._wanted = asyncio.Event()
        self.published = ""  # the inventory on the Node now
        self._said: set[str] = set()

    async def run(self, daemon: Daemon) -> None:
        async with self._api:
            writer = asyncio.ensure_future(self._write())
            try:
                await follow(daemon, self._update, uses_extender)
            finally:
                writer.cancel()
                await asyncio.gather(writer, *self._marks, return_exceptions=True)

    def _update(self, plugins: Sequence[Plugin]) -> None:
        nvidia: list[SharesPlugin] = [p for p in plugins if uses_extender(p)]  # type: ignore[misc]
        for plugin in nvidia:
            plugin.placements = self
        if not nvidia:
            return
        if len(nvidia) > 1:
            self._say(
                "more than one resource is served with replicaPolicy extender: the "
                f"extender sees {nvidia[0].resource_name} only"
            )
        text = inventory(nvidia[0]).encode()
        if text != self._latest:
            self._latest = text
            self._wanted.set()

    async def _write(self) -> None:
        """Patch the Node's annotation with the latest inventory, retrying with backoff."""
        from devplug.apiserver.client import FAILURES

        backoff = Backoff(RETRY_FIRST_S, RETRY_MAX_S)
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            text = self._latest
            try:
                await self._patch_node(text)
            except (*FAILURES, ValueError) as error:  # retried (ValueError: no JSON)
                self._say(f"cannot publish the GPU inventory on node {self.node}: {error}")
                await asyncio.sleep(backoff.next())
                self._wanted.set()
                continue
            backoff.reset()
            self.published = text
            log.info("GPU inventory published on node %s", self.node)

    async def _patch_node(self, text: str) -> None:
        from devplug.apiserver.client import STRATEGIC_PATCH

        body = {"metadata": {"annotations": {INVENTORY: text}}}
        path = f"/api/v1/nodes/{self.node}"
        await self._api.call("PATCH", path, body, content_type=STRATEGIC_PATCH)

    async def _pods(self) -> list[dict[str, Any]]:
        selector = f"spec.nodeName={self.node},status.phase=Pending"
        answer = await self._api.call("GET", "/api/v1/pods", params={"fieldSelector": selector})
        items: list[dict[str, Any]] = (answer or {}).get("items") or []
        return items

    async def match_now(self, resource: str, size: int) -> Match | None:
        """The pod a request of `size` devices of `resource` is for."""
        candidates = []
        for pod in await self._pods():
            meta = pod.get("metadata") or {}
            notes = meta.get("annotations") or {}
            uid = str(meta.get("uid", ""))
            if ASSIGNED not in notes or GIVEN in notes or uid in self._given:
                continue
            if requested(pod, resource) != size:
                continue
            candidates.append((str(meta.get("creationTimestamp", "")), meta, notes))
        if not candidates:
            return None
        _, meta, notes = min(
            candidates, key=lambda c: (c[0], c[1].get("namespace", ""), c[1]["name"])
        )
        return Match(
            meta.get("namespace", ""), meta["name"], str(meta["uid"]), tuple(ids(notes[ASSIGNED]))
        )

    async def match(self, resource: str, size: int) -> Match | None:
        """`match_now`; None, said once, when the API server cannot answer."""
        from devplug.apiserver.client import FAILURES

        try:
            return await self.match_now(resource, size)
        except (*FAILURES, ValueError) as error:
            self._say(f"cannot list the pods of node {self.node}: {error}")
            return None

    def given(self, match: Match, gpus: Sequence[str]) -> None:
        """Mark the pod given `gpus`: at once here, on the pod in the background."""
        self._given.add(match.uid)
        task = asyncio.get_running_loop().create_task(self._mark(match, tuple(gpus)))
        self._marks.add(task)
        task.add_done_callback(self._marks.discard)

    async def _mark(self, match: Match, gpus: tuple[str, ...]) -> None:
        from devplug.apiserver.client import FAILURES, STRATEGIC_PATCH

        body = {"metadata": {"annotations": {GIVEN: join(gpus)}}}
        path = f"/api/v1/namespaces/{match.namespace}/pods/{match.name}"
        try:
            await self._api.call("PATCH", path, body, content_type=STRATEGIC_PATCH)
        except (*FAILURES, ValueError) as error:  # kept in memory; the kubelet does not ask again
            self._say(f"cannot mark pod {match.pod} given: {error}")

    def _say(self, problem: str) -> None:
        if problem not in self._said:
            self._said.add(problem)
            log.warning("%s", problem)


def requested(pod: dict[str, Any], resource: str) -> int:
    """How many devices of `resource` the pod asks for (its containers' limits, as the
    device manager counts them)."""
    spec = pod.get("spec") or {}

    def own(container: dict[str, Any]) -> dict[str, int]:
        limits = (container.get("resources") or {}).get("limits") or {}
        value = limits.get(resource)
        try:
            return {resource: int(value)} if value is not None else {}
        except (TypeError, ValueError):
            return {}

    containers = [own(c) for c in spec.get("containers") or []]
    inits = [(own(c), c.get("restartPolicy") == "Always") for c in spec.get("initContainers") or []]
    return pod_requests(containers, inits).get(resource, 0)
