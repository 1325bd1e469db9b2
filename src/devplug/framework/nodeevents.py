"""Kubernetes Events on the Node when a device's health changes (the config's
`nodeEvents: true`): what `kubectl describe node` and event exporters show, beside the
log line and the metric of the same change.

A daemon service: it subscribes to the framework's `health_changed` events and posts
one events.k8s.io/v1 Event per change through devplug's asyncio client, from a queue of
its own, so nothing else waits for the API server. Events are best effort, as the
kubelet's are: a post that fails is logged (once per kind of failure) and dropped; a
backlog past QUEUE_SIZE is dropped too.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from devplug.framework import observe

if TYPE_CHECKING:
    from devplug.apiserver.client import KubeApi
    from devplug.framework.daemon import Daemon

log = logging.getLogger("devplug.nodeevents")

QUEUE_SIZE = 100
NAMESPACE = "default"  # where the kubelet puts the events of its Node
CONTROLLER = "devplug.io/devplug"
NOTE_LIMIT = 1024  # the API's limit on an Event's note
POST_TIMEOUT_S = 10.0
EVENTS = f"/apis/events.k8s.io/v1/namespaces/{NAMESPACE}/events"


class NodeEvents:
    """Posts an Event on Node `node` for each change of a device's health."""

    def __init__(self, node: str, kubeconfig: str | None = None) -> None:
        """ValueError (one line) when no kubeconfig or in-cluster account can be used;
        MissingExtra without the client's HTTP library."""
        from devplug.apiserver.client import KubeApi

        self.node = node
        self._api = KubeApi.from_kubeconfig(
            kubeconfig, extra="dra", feature="the Kubernetes API (DRA, --kubeconfig)"
        )
        self.posted = 0
        self._queue: asyncio.Queue[observe.Event] = asyncio.Queue(QUEUE_SIZE)
        self._said: set[str] = set()

    def _observe(self, event: observe.Event) -> None:
        if event.kind == observe.HEALTH_CHANGED:
            try:
                self._queue.put_nowait(event)
            except asyncio.QueueFull:
                self._say("the API server is behind: Node events dropped")

    async def run(self, daemon: Daemon | None = None) -> None:
        observe.add_observer(self._observe)
        try:
            async with self._api as api:
                while True:
                    event = await self._queue.get()
                    await self._post(api, event)
        finally:
            observe.remove_observer(self._observe)

    async def _post(self, api: KubeApi, event: observe.Event) -> None:
        from devplug.apiserver.client import FAILURES

        sick = bool(event.fields.get("unhealthy"))
        body = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"generateName": f"{self.node}.devplug-", "namespace": NAMESPACE},
            "eventTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "reportingController": CONTROLLER,
            "reportingInstance": f"devplug-{self.node}"[:128],
            "action": "HealthChanged",
            "reason": "DeviceUnhealthy" if sick else "DeviceHealthy",
            "type": "Warning" if sick else "Normal",
            "regarding": {"apiVersion": "v1", "kind": "Node", "name": self.node},
            "note": f"{event.resource}: {event.message}"[:NOTE_LIMIT],
        }
        try:
            await api.call("POST", EVENTS, body, timeout=POST_TIMEOUT_S)
        except (*FAILURES, ValueError) as error:  # an event is best effort (ValueError: no JSON)
            what = _api_problem(error)
            self._say(f"cannot post an Event on node {self.node} ({what}): dropped")
            return
        self.posted += 1

    def _say(self, problem: str) -> None:
        if problem not in self._said:
            self._said.add(problem)
            log.warning("%s", problem)


def _api_problem(error: Exception) -> str:
    """What the API server said (its Status message), or the client's error."""
    from devplug.apiserver.client import ApiError

    if not isinstance(error, ApiError):
        return str(error)
    return f"{error.status} {error.message or error.reason}"
