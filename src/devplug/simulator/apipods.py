"""Pods from an API server: the simulated kubelet runs the pods the scheduler bound to
its node, as a kubelet does (list + watch on `spec.nodeName`).

    follower = ApiPodFollower(kubelet, api, "node-a")
    task = asyncio.create_task(follower.run())

A pod bound to the node is applied once (admission, device plugins, DRA claims); a
pod deleted from the API server (or gone from a list made again) is deleted from the
node. The pods are followed by the one informer (devplug.apiserver.informer) on
devplug's asyncio client, which waits out an API server away with backoff, as a
kubelet does; the informer hands them over through a queue, so each is applied in
order without holding the watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from devplug.simulator.kubelet import Kubelet
from devplug.simulator.results import PodResult

if TYPE_CHECKING:
    from devplug.apiserver.client import KubeApi

log = logging.getLogger("devplug.simulator.apipods")


class ApiPodFollower:
    def __init__(
        self,
        kubelet: Kubelet,
        api: KubeApi,
        node_name: str,
        on_result: Callable[[PodResult], None] | None = None,
    ) -> None:
        self.kubelet = kubelet
        self.node_name = node_name
        self._api = api  # opened by the caller
        self.applied: set[str] = set()  # pod UIDs
        self._names: dict[str, tuple[str, str]] = {}  # UID -> (namespace, name) applied
        self._on_result = on_result

    async def run(self) -> None:
        """Follow the node's pods until cancelled."""
        from devplug.apiserver.informer import Informer

        queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()

        def listed(pods: list[dict[str, Any]]) -> None:
            """The whole state: the pods applied that it no longer has are gone."""
            present = {str((p.get("metadata") or {}).get("uid")) for p in pods}
            for uid in self.applied - present:
                namespace, name = self._names[uid]
                gone = {"metadata": {"uid": uid, "name": name, "namespace": namespace}}
                queue.put_nowait(("DELETED", gone))
            for pod in pods:
                queue.put_nowait(("ADDED", pod))

        informer = Informer(
            self._api,
            "/api/v1/pods",
            params={"fieldSelector": f"spec.nodeName={self.node_name}"},
            what=f"pods of node {self.node_name}",
            on_list=listed,
            on_event=lambda kind, pod: queue.put_nowait((kind, pod)),
        )
        informer.start()
        try:
            while True:
                kind, pod = await queue.get()
                await self._handle(kind, pod)
        finally:
            await informer.stop()

    async def _handle(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid, name = str(meta.get("uid")), str(meta.get("name"))
        namespace = meta.get("namespace") or "default"
        if kind == "DELETED" or meta.get("deletionTimestamp"):
            if uid in self.applied:
                self.applied.discard(uid)
                self._names.pop(uid, None)
                with contextlib.suppress(RuntimeError):
                    await self.kubelet.delete_pod(name, namespace)
            return
        if uid in self.applied:
            return
        self.applied.add(uid)
        self._names[uid] = (namespace, name)
        [result] = await self.kubelet.apply(pod)
        if self._on_result is not None:
            self._on_result(result)
        log.info(
            "pod %s/%s from the API server: %s",
            namespace,
            name,
            "admitted" if result.admitted else f"{result.reason}: {result.message}",
        )
