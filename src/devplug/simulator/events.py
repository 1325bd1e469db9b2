"""The simulated kubelet's event log: what happened on the node, in order, for
listeners and for waits that re-check a condition after every event (no polling)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from devplug.framework.generation import Generation

log = logging.getLogger("devplug.simulator.kubelet")

EVENT_HISTORY = 1000

# Event kinds
REGISTERED = "registered"
REGISTRATION_REFUSED = "registration_refused"
DEVICES = "devices"
ENDPOINT_STOPPED = "endpoint_stopped"
RESOURCE_REMOVED = "resource_removed"
POD_ADMITTED = "pod_admitted"
POD_REJECTED = "pod_rejected"
POD_DELETED = "pod_deleted"
RESTARTED = "restarted"


@dataclass(frozen=True, slots=True)
class KubeletEvent:
    """Something that happened on the node; `seq` grows by one per event."""

    seq: int
    kind: str
    resource: str = ""
    pod: str = ""  # namespace/name
    detail: str = ""
    time: float = 0.0


Listener = Callable[[KubeletEvent], None]


class EventLog:
    """The latest `EVENT_HISTORY` events, the listeners told of each, and the waits."""

    def __init__(self) -> None:
        self._events: collections.deque[KubeletEvent] = collections.deque(maxlen=EVENT_HISTORY)
        self._seq = Generation()  # the seq of the latest event
        self._listeners: list[Listener] = []

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` with every event from now on; returns a function that stops it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    @property
    def events(self) -> list[KubeletEvent]:
        """The most recent events, oldest first."""
        return list(self._events)

    @property
    def last_seq(self) -> int:
        """The `seq` of the latest event (0 before any)."""
        return self._seq.value

    def emit(self, kind: str, *, resource: str = "", pod: str = "", detail: str = "") -> None:
        self._seq.bump()  # waiters run once this call returns, after the listeners
        event = KubeletEvent(self._seq.value, kind, resource, pod, detail, time.time())
        self._events.append(event)
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                log.exception("event listener failed")

    async def wait_for(
        self, predicate: Callable[[], bool], timeout: float = 10.0, what: str = "a condition"
    ) -> None:
        """Wait until `predicate()` holds, re-checking it after every event."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._seq.wait_newer(self._seq.value), left)

    async def wait_for_event(
        self,
        kind: str,
        *,
        resource: str | None = None,
        pod: str | None = None,
        after: int = 0,
        timeout: float = 10.0,
    ) -> KubeletEvent:
        """The first event of `kind` (for `resource` / `pod` if given) with a `seq` above
        `after`, waiting for it if it has not happened yet."""

        def match() -> KubeletEvent | None:
            for event in self._events:
                if (
                    event.seq > after
                    and event.kind == kind
                    and (resource is None or event.resource == resource)
                    and (pod is None or event.pod == pod)
                ):
                    return event
            return None

        await self.wait_for(lambda: match() is not None, timeout, f"event {kind}")
        found = match()
        assert found is not None
        return found


class Recorder:
    """The event API of a node that keeps an EventLog: listeners, the recent events, and
    waits on them. The simulated kubelet is one; it records with `_emit`."""

    _log: EventLog

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` with every event from now on; returns a function that stops it."""
        return self._log.add_listener(listener)

    @property
    def events(self) -> list[KubeletEvent]:
        """The most recent events, oldest first."""
        return self._log.events

    @property
    def last_event_seq(self) -> int:
        """The `seq` of the latest event (0 before any): pass it as `after` to wait
        for what happens next."""
        return self._log.last_seq

    async def wait_for(
        self, predicate: Callable[[], bool], timeout: float = 10.0, what: str = "a condition"
    ) -> None:
        """Wait until `predicate()` holds, re-checking it after every event."""
        await self._log.wait_for(predicate, timeout, what)

    async def wait_for_event(
        self,
        kind: str,
        *,
        resource: str | None = None,
        pod: str | None = None,
        after: int = 0,
        timeout: float = 10.0,
    ) -> KubeletEvent:
        """The first event of `kind` (for `resource` / `pod` "namespace/name" if given)
        with a `seq` above `after`, waiting for it if it has not happened yet."""
        return await self._log.wait_for_event(
            kind, resource=resource, pod=pod, after=after, timeout=timeout
        )

    def _emit(self, kind: str, *, resource: str = "", pod: str = "", detail: str = "") -> None:
        self._log.emit(kind, resource=resource, pod=pod, detail=detail)
