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
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from devplug.apiserver.backoff import Backoff
from devplug.fleet.hardware import PoolHardware, build_pool
from devplug.fleet.kube import (
    MERGE_PATCH,
    RETRY_FIRST_S,
    RETRY_MAX_S,
    STRATEGIC_PATCH,
    ApiError,
    KubeApi,
    Unavailable,
    retriable,
    retrying,
)
from devplug.fleet.node import FleetNode
from devplug.fleet.objects import (
    FLEET_LABEL,
    LEASE_NAMESPACE,
    conditions,
    event_body,
    fleet_labels,
    lease_body,
    node_body,
    node_status,
    now,
    now_micro,
    taints,
)
from devplug.fleet.spec import Fleet, Pool
from devplug.framework.generation import Generation

log = logging.getLogger("devplug.fleet")

LEASE_DURATION_S = 40  # the kubelet's nodeLeaseDurationSeconds
RENEW_S = 10.0  # the kubelet renews at a quarter of the duration
STATUS_REPORT_S = 300.0  # nodeStatusReportFrequency: a heartbeat when nothing changed
WATCH_TIMEOUT_S = 300
LIST_PAGE = 500
_TERMINAL = ("Succeeded", "Failed")
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"


class FleetError(Exception):
    """The fleet cannot be started as asked; the message is one line."""


@dataclass
class Options:
    lease_duration_s: int = LEASE_DURATION_S
    renew_s: float = RENEW_S
    status_report_s: float = STATUS_REPORT_S
    # The kubelet settings a capacity run varies: None keeps the pool's.
    topology_policy: str | None = None


@dataclass
class Counters:
    registered: int = 0
    admitted: int = 0
    claims_prepared: int = 0  # ResourceClaims of admitted pods, prepared by their node
    rejected: int = 0
    waiting: int = 0
    deleted: int = 0
    lease_renewals: int = 0
    lease_failures: int = 0
    lease_late: int = 0  # a renewal not sent: the one before still had no answer
    status_writes: int = 0
    relists: int = 0
    register_s: float = 0.0
    # Time the pod watch spent waiting, one pod after another: on the claims' reads,
    # and on admissions (the device manager, the claims' preparation).
    claim_reads_s: float = 0.0
    admit_s: float = 0.0


class FleetRunner:
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
        self._done: set[str] = set()  # UIDs handled and not held (rejected, terminal)
        self._finishing: set[str] = set()
        self._writes: set[asyncio.Task[None]] = set()
        # Leases get a share of the connections of their own, so that a burst of pod
        # statuses never makes a node miss its renewals.
        lease_share = max(1, api.concurrency // 4)
        self._lease_gate = asyncio.Semaphore(lease_share)
        self._gate = asyncio.Semaphore(max(1, api.concurrency - lease_share))
        self._stop = asyncio.Event()
        # Bumped by every pod decision, relist and failed lease renewal: what to wait on.
        self.changes = Generation()
        # Called with (pod, node, admitted) after each decision: capacity runs follow it.
        self.on_pod: Callable[[Mapping[str, Any], str, bool], None] | None = None

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
        existing = await self._existing_nodes()
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

    async def _existing_nodes(self) -> dict[str, str]:
        """Node name -> its fleet label ('' for none), for every node of the cluster."""
        found: dict[str, str] = {}
        for item in await self._list("/api/v1/nodes", {}):
            meta = item.get("metadata") or {}
            found[meta.get("name", "")] = (meta.get("labels") or {}).get(FLEET_LABEL, "")
        return found

    async def _list(self, path: str, params: Mapping[str, str]) -> list[dict[str, Any]]:
        items, _ = await self._list_with_version(path, params)
        return items

    async def _list_with_version(
        self, path: str, params: Mapping[str, str]
    ) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            query = dict(params, limit=str(LIST_PAGE))
            if token:
                query["continue"] = token
            page = await self._get(path, query)
            items += page.get("items") or []
            meta = page.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token:
                return items, str(meta.get("resourceVersion", ""))

    async def _get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """A read, waiting for the API server if it is away."""
        return await retrying(f"GET {path}", lambda: self.api.call("GET", path, params=params))

    async def _gated(self, call: Callable[[], Awaitable[Any]]) -> Any:
        async with self._gate:
            return await call()

    async def _register(self, name: str, exists: bool) -> None:
        pool = self.pool_of[name]
        hardware = self.hardware[pool.name]
        status = node_status(pool, hardware.capacity(), hardware.allocatable(), now())
        body = node_body(name, self.fleet.name, pool, hardware.labels, status)
        api = self.api

        async def create() -> Any:
            if exists:
                await api.call(
                    "PATCH",
                    f"/api/v1/nodes/{name}",
                    {"metadata": {"labels": body["metadata"]["labels"]}, "spec": body["spec"]},
                    content_type=MERGE_PATCH,
                )
                return await api.call(
                    "PATCH",
                    f"/api/v1/nodes/{name}/status",
                    {"status": status},
                    content_type=MERGE_PATCH,
                )
            created = await api.call("POST", "/api/v1/nodes", body)
            # Admission adds the not-ready taint at creation; a node lifecycle
            # controller would lift it once Ready, as it is at once here.
            await api.call(
                "PATCH",
                f"/api/v1/nodes/{name}",
                {"spec": {"taints": taints(pool) or None}},
                content_type=MERGE_PATCH,
            )
            return created

        created = await retrying(f"register node {name}", lambda: self._gated(create))
        uid = created["metadata"]["uid"]
        self._node_uids[name] = uid
        lease = lease_body(name, uid, self.fleet.name, pool.name, self.options.lease_duration_s)
        self._leases[name] = await self._ensure(f"lease of {name}", LEASES, lease)
        owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}
        from devplug.framework.dra.slices import slice_bodies

        for driver in hardware.drivers:
            for piece in slice_bodies(driver, name, 1, owner):
                piece["metadata"]["labels"].update(fleet_labels(self.fleet.name, pool.name))
                await self._ensure(f"slice of {name}", SLICES, piece)
        self.counters.registered += 1

    async def _ensure(self, what: str, collection: str, body: dict[str, Any]) -> Any:
        """`_put`, waiting for the API server if it is away."""
        return await retrying(what, lambda: self._gated(lambda: self._put(collection, body)))

    async def _put(self, collection: str, body: dict[str, Any]) -> Any:
        """Create the object, or replace the one of the same name."""
        try:
            return await self.api.call("POST", collection, body)
        except ApiError as error:
            if error.status != 409:
                raise
        path = f"{collection}/{body['metadata']['name']}"
        current = await self.api.call("GET", path)
        body = dict(body, metadata=dict(body["metadata"]))
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        return await self.api.call("PUT", path, body)

    # -- serving ----------------------------------------------------------------------

    async def serve(self, stop: asyncio.Event) -> None:
        """Run the nodes until `stop` is set."""
        self._stop = stop
        tasks = [
            asyncio.create_task(self._follow_pods(), name="fleet pods"),
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
        pending = set(self._writes)
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    def _write(self, what: str, call: Callable[[], Awaitable[Any]]) -> None:
        """A write that must reach the API server: retried while it is away; a pod or
        node that is gone meanwhile ends it quietly."""

        async def run() -> None:
            try:
                await retrying(what, lambda: self._gated(call), stop=self._stop)
            except ApiError as error:
                if error.status not in (404, 409):
                    log.warning("%s: %s", what, error)
            except Unavailable as error:
                log.warning("%s: given up at shutdown: %s", what, error)

        task = asyncio.create_task(run())
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    # -- pods ----------------------------------------------------------------------------

    async def _follow_pods(self) -> None:
        """List and watch the pods bound to any node; relist after the watch fell too
        far behind (or the API server was away), reconciling what the nodes hold."""
        version = ""
        backoff = Backoff(RETRY_FIRST_S, RETRY_MAX_S)
        while not self._stop.is_set():
            try:
                if not version:
                    items, version = await self._list_with_version(
                        "/api/v1/pods", {"fieldSelector": "spec.nodeName!="}
                    )
                    await self._reconcile(items)
                version = await self._watch_pods(version)
                backoff.reset()
            except (Unavailable, ApiError) as error:
                if isinstance(error, ApiError) and error.status == 410:
                    version = ""
                    continue
                if not retriable(error):
                    raise  # refused for good (401, 403): the fleet cannot follow its pods
                delay = backoff.next()
                log.warning("watching pods: %s; again in %.1f s", error, delay)
                await asyncio.sleep(delay)
                version = ""  # relist: reconcile what happened while away
                self.counters.relists += 1
                self.changes.bump()

    async def _watch_pods(self, version: str) -> str:
        """One watch of the bound pods from `version` (the version to go on from, ""
        to list again). Each event is handled in turn, as before; the claims of a pod
        to admit are read as its event arrives, beside the events before it (a kubelet
        has a worker per pod), so that a burst of DRA pods does not wait one claim read
        after another."""
        params = {
            "fieldSelector": "spec.nodeName!=",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
        }
        tail: asyncio.Task[None] | None = None
        try:
            async for line in self.api.watch("/api/v1/pods", params, WATCH_TIMEOUT_S):
                event = msgspec.json.decode(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        version = ""  # expired: list again
                    break
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind != "BOOKMARK":
                    tail = self._in_turn(str(kind), obj, tail)
                failed = tail is not None and tail.done() and not tail.cancelled()
                if failed and tail is not None and tail.exception() is not None:
                    break  # raised below
        except asyncio.CancelledError:
            if tail is not None:
                tail.cancel()  # and, through each awaiting the one before, the rest
            raise
        except BaseException:
            if tail is not None:
                await asyncio.gather(tail, return_exceptions=True)
            raise
        if tail is not None:
            await tail
        return version

    def _in_turn(
        self, kind: str, pod: dict[str, Any], after: asyncio.Task[None] | None
    ) -> asyncio.Task[None]:
        """Handle one pod event once the events before it (`after`) are handled; its
        claims read now where the pod is one to admit."""
        reading = self._read_ahead(kind, pod)

        async def step() -> None:
            try:
                if after is not None:
                    await after
                await self._on_pod(kind, pod, reading)
            finally:
                if reading is not None:
                    reading.cancel()  # unused (the pod was skipped): nothing to keep
                    with contextlib.suppress(BaseException):
                        await reading

        return asyncio.create_task(step())

    def _read_ahead(self, kind: str, pod: dict[str, Any]) -> asyncio.Task[dict[str, Any]] | None:
        """The claims of a pod bound to one of our nodes and not yet admitted, being
        read; None for any other pod."""
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        node = self.nodes.get(spec.get("nodeName", ""))
        if kind == "DELETED" or node is None or not spec.get("resourceClaims"):
            return None
        uid = str(meta.get("uid"))
        if meta.get("deletionTimestamp") or uid in node.held or uid in self._done:
            return None
        if (pod.get("status") or {}).get("phase") in _TERMINAL:
            return None
        return asyncio.create_task(self._gated(lambda: self._claims_of(pod)))

    async def _reconcile(self, items: Sequence[dict[str, Any]]) -> None:
        """After a (re)list: pods gone meanwhile are released, new ones admitted."""
        present = {(p.get("metadata") or {}).get("uid") for p in items}
        for node in self.nodes.values():
            for uid in [u for u in node.held if u not in present]:
                await self._release(node, uid)
        for pod in items:
            await self._on_pod("ADDED", pod)

    async def _on_pod(
        self,
        kind: str,
        pod: dict[str, Any],
        reading: asyncio.Task[dict[str, Any]] | None = None,
    ) -> None:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        node = self.nodes.get(spec.get("nodeName", ""))
        if node is None:
            return
        uid = str(meta.get("uid"))
        if kind == "DELETED":
            await self._release(node, uid)
            self._done.discard(uid)
            self._finishing.discard(uid)
            return
        if meta.get("deletionTimestamp"):
            await self._release(node, uid)
            if uid not in self._finishing:
                self._finishing.add(uid)
                self._finish_deletion(meta)
            return
        if uid in node.held or uid in self._done:
            return
        phase = (pod.get("status") or {}).get("phase")
        if phase in _TERMINAL:
            self._done.add(uid)
            return
        started = time.monotonic()
        claims = await (reading if reading is not None else self._claims_of(pod))
        read = time.monotonic()
        admission = await node.admit(pod, claims)
        self.counters.claim_reads_s += read - started
        self.counters.admit_s += time.monotonic() - read
        pool = self.pool_of[node.name].name
        namespace, name = meta.get("namespace", "default"), meta.get("name", "")
        if admission.admitted:
            self.counters.admitted += 1
            self.counters.claims_prepared += len(node.held[uid].claims)
        elif admission.status:
            self.counters.rejected += 1
            self._done.add(uid)
        else:
            self.counters.waiting += 1
            self._done.add(uid)
        if admission.status:
            patch = {"metadata": {"uid": uid}, "status": admission.status}
            path = f"/api/v1/namespaces/{namespace}/pods/{name}/status"

            async def write_status(path: str = path, patch: dict[str, Any] = patch) -> None:
                await self.api.call("PATCH", path, patch, content_type=STRATEGIC_PATCH)
                self.counters.status_writes += 1
                self.changes.bump()

            self._write(f"status of pod {namespace}/{name}", write_status)
        if admission.event is not None:
            body = event_body(pod, node.name, *admission.event, self.fleet.name, pool)
            self._write(
                f"event of pod {namespace}/{name}",
                lambda: self.api.call("POST", f"/api/v1/namespaces/{namespace}/events", body),
            )
        if self.on_pod is not None:
            self.on_pod(pod, node.name, admission.admitted)
        self.changes.bump()

    async def _release(self, node: FleetNode, uid: str) -> None:
        if await node.release(uid):
            self.counters.deleted += 1
            self.changes.bump()

    async def _claims_of(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        """The ResourceClaims the pod names, read now (the scheduler wrote their
        allocation before it bound the pod)."""
        from devplug.simulator.dra import pod_claims
        from devplug.simulator.pods import PodSpec, parse_pod

        if not (pod.get("spec") or {}).get("resourceClaims"):
            return {}  # most pods: no second parse (admission parses the pod)
        parsed = parse_pod(pod)
        if not isinstance(parsed, PodSpec):
            return {}
        found: dict[str, Any] = {}
        for claim in pod_claims(parsed).values():
            path = f"/apis/resource.k8s.io/v1/namespaces/{parsed.namespace}/resourceclaims/{claim}"
            with contextlib.suppress(ApiError):
                found[claim] = await self._get(path)
        return found

    def _finish_deletion(self, meta: Mapping[str, Any]) -> None:
        """Once its containers are gone, the kubelet deletes the pod for good."""
        namespace, name = meta.get("namespace", "default"), meta.get("name", "")
        body = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": meta.get("uid")},
        }
        self._write(
            f"deletion of pod {namespace}/{name}",
            lambda: self.api.call("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body),
        )

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
            async with self._lease_gate:
                try:
                    self._leases[name] = await self.api.call("PUT", path, lease)
                except ApiError as error:
                    if error.status == 404:
                        lease["metadata"].pop("resourceVersion", None)
                        self._leases[name] = await self._put(LEASES, lease)
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
            self._write(
                f"heartbeat of node {name}",
                lambda: self.api.call(
                    "PATCH", f"/api/v1/nodes/{name}/status", patch, content_type=STRATEGIC_PATCH
                ),
            )

        await self._spread(self.options.status_report_s, beat)


async def _listed(api: KubeApi, path: str, params: Mapping[str, str]) -> list[dict[str, Any]]:
    page = await retrying(f"list {path}", lambda: api.call("GET", path, params=params))
    return list(page.get("items") or [])


async def remove_fleet(api: KubeApi, fleet: str) -> dict[str, int]:
    """Delete what `fleet up` created for `fleet` (by its label, each object by its
    UID): Nodes, Leases, ResourceSlices and Events; nothing else. The count of each."""
    selector = {"labelSelector": f"{FLEET_LABEL}={fleet}"}
    collections = {
        "nodes": ("/api/v1/nodes", False),
        "leases": (LEASES, False),
        "resourceslices": (SLICES, False),
        "events": ("/api/v1/events", True),
    }
    removed: dict[str, int] = {}
    gate = asyncio.Semaphore(api.concurrency)
    for kind, (path, namespaced) in collections.items():
        items = await _listed(api, path, selector)

        async def delete(
            item: dict[str, Any], path: str = path, namespaced: bool = namespaced
        ) -> None:
            meta = item["metadata"]
            where = (
                f"/api/v1/namespaces/{meta['namespace']}/events/{meta['name']}"
                if namespaced
                else f"{path}/{meta['name']}"
            )
            body = {"kind": "DeleteOptions", "apiVersion": "v1",
                    "preconditions": {"uid": meta["uid"]}}  # fmt: skip
            async with gate:
                with contextlib.suppress(ApiError):
                    await retrying(f"delete {where}", lambda: api.call("DELETE", where, body))

        await asyncio.gather(*(delete(item) for item in items))
        removed[kind] = len(items)
    return removed
