"""The device manager's registered resources: per resource its plugin's endpoint and
the devices it listed last. A registration makes a connected endpoint the resource's
one; its ListAndWatch stream updates the devices; when it ends every device turns
unhealthy, and the resource goes after the grace period unless its plugin registers
again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from devplug.api.constants import HEALTHY
from devplug.api.v1beta1 import api_pb2 as pb
from devplug.simulator.devicestate import DeviceInfo, EventSink, ResourceState
from devplug.simulator.endpoint import CLOSED_BY_PLUGIN, Endpoint, EndpointError
from devplug.simulator.events import ENDPOINT_STOPPED, RESOURCE_REMOVED

log = logging.getLogger("devplug.simulator.manager")


class ResourceRegistry:
    """The resources by name. `changed()` is called when a device list or the set of
    resources changes, `save()` when the checkpoint should be written, and
    `on_event(kind, resource, detail)` on every change worth telling."""

    def __init__(
        self,
        *,
        grace_period: float,
        dial_timeout: float,
        changed: Callable[[], None],
        save: Callable[[], None],
        on_event: EventSink,
    ) -> None:
        self.grace_period = grace_period
        self.dial_timeout = dial_timeout
        self._changed = changed
        self._save = save
        self._on_event = on_event
        self.resources: dict[str, ResourceState] = {}
        self.closed = False

    async def register(self, resource: str, socket_path: Path) -> Endpoint:
        """Connect to a registering plugin and make it the resource's endpoint."""
        endpoint = await Endpoint.connect(resource, socket_path, self.dial_timeout)
        return await self.attach(resource, endpoint)

    async def attach(self, resource: str, endpoint: Endpoint) -> Endpoint:
        """Make a connected `endpoint` the resource's one (a registration after the
        dial; an in-process plugin of a simulated fleet node without one)."""
        if self.closed:
            await endpoint.close()
            raise EndpointError("the kubelet is stopping")
        old = self.resources.get(resource)
        if old is None:
            state = ResourceState(endpoint)
            self.resources[resource] = state
            self._changed()
        else:
            state = old
            self._cancel_expiry(state)
            previous, previous_watch = state.endpoint, state.watch
            state.endpoint = endpoint
            await previous.close()
            if previous_watch is not None:
                previous_watch.cancel()
        state.watch = asyncio.create_task(self._watch(resource, endpoint), name=f"watch {resource}")
        return endpoint

    def restored(self, resource: str) -> None:
        """A resource the checkpoint names: no devices until its plugin registers again,
        gone after the grace period if it does not."""
        state = ResourceState(Endpoint.stopped(resource))
        self.resources[resource] = state
        self._schedule_expiry(resource, state)

    async def _watch(self, resource: str, endpoint: Endpoint) -> None:
        why = await endpoint.list_and_watch(
            lambda devices: self._on_devices(resource, endpoint, devices)
        )
        state = self.resources.get(resource)
        if state is None or state.endpoint is not endpoint or self.closed:
            return  # replaced or shutting down: nothing to mark
        if why == CLOSED_BY_PLUGIN:  # the plugin stopping: what it meant to do
            log.info("%s: the device plugin closed its ListAndWatch stream", resource)
        else:
            log.warning("%s: ListAndWatch ended unexpectedly for device plugin: %s", resource, why)
        await endpoint.close()
        state.mark_unhealthy()
        self._changed()
        self._schedule_expiry(resource, state)
        self._save()
        self._on_event(ENDPOINT_STOPPED, resource, why)

    def _on_devices(self, resource: str, endpoint: Endpoint, devices: Sequence[pb.Device]) -> None:
        state = self.resources.get(resource)
        if state is None or state.endpoint is not endpoint:
            return
        state.set_devices(
            DeviceInfo(d.ID, d.health == HEALTHY, tuple(int(n.ID) for n in d.topology.nodes))
            for d in devices
        )
        state.listed_by = endpoint
        self._changed()
        log.info(
            "%s: device list pushed: %d devices, %d healthy",
            resource,
            len(state.devices),
            len(state.healthy),
        )
        self._save()
        self._on_event("devices", resource, f"{len(state.healthy)}/{len(state.devices)} healthy")

    def _schedule_expiry(self, resource: str, state: ResourceState) -> None:
        self._cancel_expiry(state)
        loop = asyncio.get_running_loop()
        state.expires_at = time.monotonic() + self.grace_period
        state.expiry = loop.call_later(self.grace_period, self._expire, resource, state.endpoint)

    @staticmethod
    def _cancel_expiry(state: ResourceState) -> None:
        if state.expiry is not None:
            state.expiry.cancel()
        state.expiry = None
        state.expires_at = None

    def _expire(self, resource: str, endpoint: Endpoint) -> None:
        state = self.resources.get(resource)
        if state is None or state.endpoint is not endpoint or not endpoint.stopped_endpoint:
            return
        del self.resources[resource]
        self._changed()
        log.info("%s: grace period over, resource removed", resource)
        self._save()
        self._on_event(RESOURCE_REMOVED, resource, "")

    def grace_left(self, resource: str) -> float | None:
        state = self.resources.get(resource)
        if state is None or state.expires_at is None:
            return None
        return max(0.0, state.expires_at - time.monotonic())

    async def close(self) -> None:
        """Stop every endpoint."""
        self.closed = True
        tasks = []
        for state in self.resources.values():
            self._cancel_expiry(state)
            await state.endpoint.close()
            if state.watch is not None:
                state.watch.cancel()
                tasks.append(state.watch)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
