"""The node label that picks a node's NVIDIA config (`nvidia.com/device-plugin.config`),
read from the API server and watched, as NVIDIA's config manager sidecar does.

Only an `nvidiaConfig.folder` needs it, and only then is the Kubernetes client imported
(`devplug serve` stays lean otherwise). The labels are read once before the config is
built, then a watch on this node (a field selector on its name) follows them; a change
of one of the labels that matter asks the config reloader for a reload, which builds
with the new labels: a label naming no config is refused in one line and the running
config keeps serving. The watch runs in a daemon thread (the client blocks), restarted
with backoff when it fails, said once per new problem.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from devplug.config import nvidiafile

if TYPE_CHECKING:
    from devplug.config.root import Config
    from devplug.framework.daemon import Daemon

log = logging.getLogger("devplug.sources.nvidia")

WATCH_SECONDS = 300  # one watch request at most this long, then a new one
RETRY_MAX_SECONDS = 60.0


def label_keys(config: Config) -> list[str]:
    """The node labels the config's NVIDIA config folders are chosen by."""
    keys = []
    for resource in config.resources:
        ref = resource.nvidia.nvidia_config if resource.nvidia is not None else None
        if ref is not None and ref.folder and ref.node_label not in keys:
            keys.append(ref.node_label)
    return keys


def read_labels(node: str, kubeconfig: str | None, context: str | None = None) -> dict[str, str]:
    """This node's labels now; ValueError with one line when they cannot be read."""
    from devplug.apiserver.failures import say
    from devplug.framework.dra.kube import api_client, node_labels

    session = api_client(kubeconfig, context)  # first: it lets in the ssl module
    try:
        return node_labels(session, node)
    except Exception as error:  # the client's answers and urllib3's connection errors
        raise ValueError(f"cannot read node {node}: {say(error)}") from None


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
        self._stop = threading.Event()

    async def run(self, daemon: Daemon) -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def seen(labels: dict[str, str]) -> None:
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

        def post(labels: dict[str, str]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(seen, labels)

        def finished() -> None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, done)

        thread = threading.Thread(
            target=self._follow, args=(post, finished), name="node labels", daemon=True
        )
        thread.start()
        try:
            await done
        finally:
            self._stop.set()

    def _follow(self, post: Callable[[dict[str, str]], None], finished: Callable[[], None]) -> None:
        """Watch the node until stopped (blocking: the watch thread)."""
        try:
            from devplug.framework.dra.kube import api_client

            session = api_client(self.kubeconfig, self.context)  # first: it lets in ssl
            from kubernetes import client, watch

            api: Any = client.CoreV1Api(session)
            watcher: Any = watch.Watch
        except Exception as error:
            log.error("node %s: cannot watch its labels: %s", self.node, error)
            finished()
            return
        from devplug.apiserver import failures
        from devplug.apiserver.backoff import WATCH_MARGIN_S, Backoff

        backoff, said = Backoff(1.0, RETRY_MAX_SECONDS), ""
        while not self._stop.is_set():
            try:
                listed = api.list_node(
                    field_selector=f"metadata.name={self.node}", _request_timeout=30
                )
                for item in listed.items:
                    post(dict(item.metadata.labels or {}))
                version = listed.metadata.resource_version
                stream: Any = watcher().stream(
                    api.list_node,
                    field_selector=f"metadata.name={self.node}",
                    resource_version=version,
                    timeout_seconds=WATCH_SECONDS,
                    _request_timeout=(10, WATCH_SECONDS + WATCH_MARGIN_S),
                )
                for event in stream:
                    if self._stop.is_set():
                        break
                    obj = event["object"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        post(dict(obj.metadata.labels or {}))
                    elif event["type"] == "DELETED":
                        post({})
                    elif event["type"] == "ERROR":  # the version is gone: list again
                        break
                if said:
                    log.info("node %s: watching its labels again", self.node)
                backoff.reset()
                said = ""
            except Exception as error:  # the API server away, a dropped connection
                problem = failures.say(error)
                permanent = failures.kind(error) == failures.PERMANENT
                if problem != said:
                    log.log(
                        logging.ERROR if permanent else logging.WARNING,
                        "node %s: watching its labels failed: %s; %s",
                        self.node,
                        problem,
                        f"again every {RETRY_MAX_SECONDS:.0f} s" if permanent else "retrying",
                    )
                said = problem
                # A permanent failure waits for someone to fix it: the slowest pace.
                self._stop.wait(RETRY_MAX_SECONDS if permanent else backoff.next())
        finished()


def _settle(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)
