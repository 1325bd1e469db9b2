"""Pods from an API server: the simulated kubelet runs the pods the scheduler bound to
its node, as a kubelet does (list + watch on `spec.nodeName`).

    follower = ApiPodFollower(kubelet, api_client, "node-a")
    task = asyncio.create_task(follower.run())

A pod bound to the node is applied once (admission, device plugins, DRA claims); a
pod deleted from the API server is deleted from the node. The `kubernetes` client's
watch blocks, so it runs in a thread that hands events to the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from devplug.simulator.kubelet import Kubelet
from devplug.simulator.results import PodResult

log = logging.getLogger("devplug.simulator.apipods")

WATCH_TIMEOUT_S = 5


class ApiPodFollower:
    def __init__(
        self,
        kubelet: Kubelet,
        api_client: Any,
        node_name: str,
        on_result: Callable[[PodResult], None] | None = None,
    ) -> None:
        from kubernetes import client

        self.kubelet = kubelet
        self.node_name = node_name
        self._api_client = api_client
        self._core: Any = client.CoreV1Api(api_client)
        self._stopping = threading.Event()
        self.applied: set[str] = set()  # pod UIDs
        self._on_result = on_result

    def _watch(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Any]) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        from devplug.apiserver.failures import say

        selector = f"spec.nodeName={self.node_name}"
        while not self._stopping.is_set():
            watcher: Any = watch.Watch()  # type: ignore[no-untyped-call]
            try:
                for event in watcher.stream(
                    self._core.list_pod_for_all_namespaces,
                    field_selector=selector,
                    timeout_seconds=WATCH_TIMEOUT_S,
                    # From the watch cache as it is: no wait for it to catch up.
                    resource_version="0",
                ):
                    if self._stopping.is_set():
                        watcher.stop()
                        break
                    pod = self._api_client.sanitize_for_serialization(event["object"])
                    loop.call_soon_threadsafe(queue.put_nowait, (event["type"], pod))
            except ApiException as error:
                # Expired, or the watch cache is behind (old etcd): watch anew.
                if error.status in (410, 504):
                    continue
                if not self._stopping.is_set():
                    loop.call_soon_threadsafe(queue.put_nowait, ("ERROR", say(error)))
                return
            except Exception as error:  # the API server went away: stop following
                if not self._stopping.is_set():
                    loop.call_soon_threadsafe(queue.put_nowait, ("ERROR", say(error)))
                return

    async def run(self) -> None:
        """Follow the node's pods until cancelled."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        thread = threading.Thread(
            target=self._watch, args=(loop, queue), name="pod watch", daemon=True
        )
        thread.start()
        try:
            while True:
                kind, pod = await queue.get()
                if kind == "ERROR":
                    raise RuntimeError(f"watching pods failed: {pod}")
                await self._handle(kind, pod)
        finally:
            self._stopping.set()

    async def _handle(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid, name = str(meta.get("uid")), str(meta.get("name"))
        namespace = meta.get("namespace") or "default"
        if kind == "DELETED" or meta.get("deletionTimestamp"):
            if uid in self.applied:
                self.applied.discard(uid)
                with contextlib.suppress(RuntimeError):
                    await self.kubelet.delete_pod(name, namespace)
            return
        if uid in self.applied:
            return
        self.applied.add(uid)
        [result] = await self.kubelet.apply(pod)
        if self._on_result is not None:
            self._on_result(result)
        log.info(
            "pod %s/%s from the API server: %s",
            namespace,
            name,
            "admitted" if result.admitted else f"{result.reason}: {result.message}",
        )
