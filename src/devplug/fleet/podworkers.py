"""The pods bound to the fleet's nodes, as each node's kubelet follows its own: one
list and watch for all nodes (relisted, and reconciled with what the nodes hold, after
the watch fell behind or the API server was away); each event handled in turn, the
claims of a pod to admit read as its event arrives; admission by the node, then the
pod's status and event written; a deleted pod released and deleted for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from devplug.apiserver.backoff import Backoff
from devplug.fleet.calls import FleetCalls
from devplug.fleet.counters import Counters
from devplug.fleet.kube import (
    RETRY_FIRST_S,
    RETRY_MAX_S,
    STRATEGIC_PATCH,
    ApiError,
    Unavailable,
    retriable,
)
from devplug.fleet.node import FleetNode
from devplug.fleet.objects import event_body
from devplug.fleet.spec import Pool
from devplug.framework.generation import Generation

log = logging.getLogger("devplug.fleet")

WATCH_TIMEOUT_S = 300
_TERMINAL = ("Succeeded", "Failed")

# Called with (pod, node, admitted) after each decision.
Decided = Callable[[Mapping[str, Any], str, bool], None]


class PodWorkers:
    """The pod side of the fleet's nodes (`nodes`, by name, with their pools).
    `changes` is bumped by every decision, release and relist."""

    def __init__(
        self,
        calls: FleetCalls,
        fleet: str,
        nodes: Mapping[str, FleetNode],
        pool_of: Mapping[str, Pool],
        counters: Counters,
        changes: Generation,
        decided: Decided,
    ) -> None:
        self._calls = calls
        self._api = calls.api
        self._fleet = fleet
        self.nodes = nodes
        self.pool_of = pool_of
        self.counters = counters
        self.changes = changes
        self._decided = decided
        self._done: set[str] = set()  # UIDs handled and not held (rejected, terminal)
        self._finishing: set[str] = set()

    async def follow(self) -> None:
        """List and watch the pods bound to any node; relist after the watch fell too
        far behind (or the API server was away), reconciling what the nodes hold."""
        version = ""
        backoff = Backoff(RETRY_FIRST_S, RETRY_MAX_S)
        while not self._calls.stop.is_set():
            try:
                if not version:
                    items, version = await self._calls.list_with_version(
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
            async for line in self._api.watch("/api/v1/pods", params, WATCH_TIMEOUT_S):
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
        return asyncio.create_task(self._calls.gated(lambda: self._claims_of(pod)))

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
                await self._api.call("PATCH", path, patch, content_type=STRATEGIC_PATCH)
                self.counters.status_writes += 1
                self.changes.bump()

            self._calls.write(f"status of pod {namespace}/{name}", write_status)
        if admission.event is not None:
            body = event_body(pod, node.name, *admission.event, self._fleet, pool)
            self._calls.write(
                f"event of pod {namespace}/{name}",
                lambda: self._api.call("POST", f"/api/v1/namespaces/{namespace}/events", body),
            )
        self._decided(pod, node.name, admission.admitted)
        self.changes.bump()

    async def _release(self, node: FleetNode, uid: str) -> None:
        if await node.release(uid):
            self.counters.deleted += 1
            self.changes.bump()

    async def _claims_of(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        """The ResourceClaims the pod names, read now (the scheduler wrote their
        allocation before it bound the pod)."""
        from devplug.simulator.podclaims import pod_claims
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
                found[claim] = await self._calls.get(path)
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
        self._calls.write(
            f"deletion of pod {namespace}/{name}",
            lambda: self._api.call("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body),
        )
