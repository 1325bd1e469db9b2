"""The node label that picks a node's NVIDIA config (`nvidia.com/device-plugin.config`),
read from the API server and watched, as NVIDIA's config manager sidecar does.

Only an `nvidiaConfig.folder` (or `nodeModeLabel`) needs it, and only then is the
Kubernetes client imported (`devplug serve` stays lean otherwise). The labels are read
once before the config is built, then an informer on this node (a field selector on
its name, devplug.apiserver.informer) follows them in the daemon's event loop; a change
of one of the labels that matter asks the config reloader for a reload, which builds
with the new labels: a label naming no config is refused in one line and the running
config keeps serving. A failed list or watch is tried again with backoff, said in one
line.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from devplug.config import nvidiafile

if TYPE_CHECKING:
    from devplug.config.root import Config
    from devplug.framework.daemon import Daemon

log = logging.getLogger("devplug.sources.nvidia")

FEATURE = "the node's labels from the Kubernetes API (--kubeconfig)"
_T = TypeVar("_T")


def label_keys(config: Config) -> list[str]:
    """The node labels the config's NVIDIA config folders are chosen by."""
    keys = []
    for resource in config.resources:
        ref = resource.nvidia.nvidia_config if resource.nvidia is not None else None
        if ref is not None and ref.folder and ref.node_label not in keys:
            keys.append(ref.node_label)
    return keys


def labels_of(node: dict[str, Any]) -> dict[str, str]:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()}


def read_labels(
    node: str, kubeconfig: str | None, context: str | None = None, *, waiting: str = ""
) -> dict[str, str]:
    """This node's labels now; ValueError with one line when they cannot be read.
    `waiting` (what they are read for): an API server away or overloaded is waited for,
    said once, instead of failing."""
    from devplug.apiserver.client import FAILURES, KubeApi, retrying

    api = KubeApi.from_kubeconfig(kubeconfig, context, extra="dra", feature=FEATURE)

    async def read() -> dict[str, str]:
        async with api:

            async def once() -> dict[str, str]:
                return labels_of(await api.call("GET", f"/api/v1/nodes/{node}"))

            if not waiting:
                return await once()
            return await retrying(f"cannot read node {node} for {waiting}", once)

    try:
        return _blocking(read)
    except FAILURES as error:
        raise ValueError(f"cannot read node {node}: {_say(error)}") from None


def _blocking(call: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """The result of `call()` in an event loop of its own: in this thread, or in one of
    its own where this thread runs a loop already."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(call())
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(call())).result()


def _say(error: Exception) -> str:
    """One line: the status of an answer (as "404 Not Found"), what else went wrong."""
    from http import HTTPStatus

    from devplug.apiserver import failures
    from devplug.apiserver.client import ApiError, say

    if isinstance(error, ApiError) and failures.kind(error) == failures.ANSWER:
        try:
            return f"{error.status} {HTTPStatus(error.status).phrase}"
        except ValueError:  # a status HTTP does not name
            pass
    return say(error)


class NodeLabelWatch:
    """A daemon service: keeps `nvidiafile.node_labels` in step with the node's labels
    and calls `changed` when one of `keys` changes."""

    def __init__(
        self,
        node: str,
        kubeconfig: str | None,
        keys: list[str],
        changed: Callable[[], None],
        context: str | None = None,
    ) -> None:
        self.node = node
        self.kubeconfig = kubeconfig
        self.context = context
        self.keys = keys
        self.changed = changed

    def _seen(self, labels: dict[str, str]) -> None:
        old = nvidiafile.node_labels or {}
        nvidiafile.node_labels = labels
        moved = [k for k in self.keys if old.get(k) != labels.get(k)]
        if moved:
            log.info(
                "node %s: %s: reloading",
                self.node,
                ", ".join(f"{k}={labels.get(k, '')!r}" for k in moved),
            )
            self.changed()

    async def run(self, daemon: Daemon | None) -> None:
        """Follow the node's labels until cancelled."""
        from devplug.apiserver.client import KubeApi
        from devplug.apiserver.informer import Informer

        try:
            api = KubeApi.from_kubeconfig(
                self.kubeconfig, self.context, extra="dra", feature=FEATURE
            )
        except (ImportError, ValueError) as error:
            log.error("node %s: cannot watch its labels: %s", self.node, error)
            return

        def listed(items: list[dict[str, Any]]) -> None:
            self._seen(labels_of(items[0]) if items else {})

        def changed(kind: str, obj: dict[str, Any]) -> None:
            self._seen({} if kind == "DELETED" else labels_of(obj))

        async with api:
            await Informer(
                api,
                "/api/v1/nodes",
                params={"fieldSelector": f"metadata.name={self.node}"},
                what=f"node {self.node}: watching its labels failed",
                on_list=listed,
                on_event=changed,
            ).run()
