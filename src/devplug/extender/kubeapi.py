"""The extender's reads and writes through the API server: Nodes, pods, the ASSIGNED
annotation and the Binding; and the informers its cache follows (devplug.extender.cache).
Every call the extender makes to the API server is here, so the client under it can be
changed in one place.

They go through devplug's asyncio client (devplug.apiserver.client) in an event loop of
their own thread (devplug.ground.loopthread): the HTTP server answers each request in a
thread, which waits for its call there, while the informers list and watch in the same
loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from devplug.apiserver.informer import WATCH_TIMEOUT_S, Informer
from devplug.ground.loopthread import LoopThread

if TYPE_CHECKING:
    from devplug.apiserver.client import KubeApi as Client

LIVE = "status.phase!=Succeeded,status.phase!=Failed"  # the pods that hold their shares
KINDS = ("nodes", "pods")
# Each kind's collection and its selector.
COLLECTIONS: dict[str, tuple[str, dict[str, str]]] = {
    "nodes": ("/api/v1/nodes", {}),
    "pods": ("/api/v1/pods", {"fieldSelector": LIVE}),
}
FEATURE = "the scheduler extender (devplug extender)"


class KubeApi(LoopThread):
    """`verbs.Api` over a real API server."""

    def __init__(
        self,
        kubeconfig: str | None = None,
        context: str | None = None,
        *,
        client: Client | None = None,
    ) -> None:
        """ValueError (one line) when no kubeconfig or in-cluster account can be used;
        MissingExtra without the client's HTTP library. `client`: that one instead."""
        from devplug.apiserver.client import KubeApi as Client

        self.client = client or Client.from_kubeconfig(
            kubeconfig, context, extra="dra", feature=FEATURE
        )
        self._start_loop("extender api")
        self.run(self.client.__aenter__())

    def close(self) -> None:
        if self._loop is None:
            return
        self.run(self.client.__aexit__())
        self._stop_loop()

    # -- the informers of the cache ------------------------------------------------

    def informer(
        self,
        kind: str,
        on_list: Callable[[list[dict[str, Any]]], None],
        on_event: Callable[[str, dict[str, Any]], None],
        watch_timeout_s: int = WATCH_TIMEOUT_S,
    ) -> Informer:
        """An informer of `kind` ("nodes", or "pods" not Succeeded nor Failed), its
        callbacks called in the client's thread; `start` runs it."""
        if kind not in COLLECTIONS:
            raise ValueError(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
        path, params = COLLECTIONS[kind]
        return Informer(
            self.client,
            path,
            params=params,
            what=kind,
            on_list=on_list,
            on_event=on_event,
            watch_timeout_s=watch_timeout_s,
        )

    def start(self, informer: Informer) -> None:
        self._sync(informer.start)

    def stop(self, informer: Informer) -> None:
        if self._loop is not None:
            self.run(informer.stop())

    # -- reads and writes ----------------------------------------------------------

    def _items(self, kind: str) -> list[dict[str, Any]]:
        path, params = COLLECTIONS[kind]
        answer = self.run(self.client.call("GET", path, params=params or None))
        items: list[dict[str, Any]] = answer.get("items") or []
        return items

    def nodes(self) -> list[dict[str, Any]]:
        return self._items("nodes")

    def pods(self) -> list[dict[str, Any]]:
        return self._items("pods")

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        pod: dict[str, Any] = self.run(
            self.client.call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        )
        return pod

    def annotate(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        from devplug.apiserver.client import STRATEGIC_PATCH

        body = {"metadata": {"annotations": dict(annotations)}}
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        self.run(self.client.call("PATCH", path, body, content_type=STRATEGIC_PATCH))

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self.run(
            self.client.call("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body)
        )
