"""The class a plugin author subclasses: a resource name, a device list, optional hooks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

import grpc

from devplug.framework import observe
from devplug.framework.device import ContainerEdits, Device, merge_edits
from devplug.framework.generation import Generation
from devplug.framework.limits import Limits, device_limit_problem
from devplug.kube.names import resource_name_problem

log = logging.getLogger("devplug.plugin")


class AllocationError(Exception):
    """Refuse a kubelet request from a hook; the kubelet sees `code` and the message."""

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT):
        super().__init__(message)
        self.code = code


class Plugin:
    """One extended resource served to the kubelet.

    Subclasses describe hardware: `scan` publishes the full device list (and keeps
    publishing when it changes); everything else has a working default. Set
    `preferred_allocation = True` to offer GetPreferredAllocation (NUMA-local picks
    by default); override `pre_start` to be called before each container start.
    """

    resource_name: str = ""
    # Env var that receives the comma-separated IDs of the allocated devices.
    ids_env: str | None = None
    preferred_allocation: bool = False
    # Bounds on requests and on the device list (see devplug.framework.limits).
    limits: Limits = Limits()

    def __init__(
        self,
        resource_name: str | None = None,
        devices: Iterable[Device] | None = None,
        *,
        socket_name: str | None = None,
    ) -> None:
        if resource_name is not None:
            self.resource_name = resource_name
        if problem := resource_name_problem(self.resource_name):
            raise ValueError(f"resource name: {problem}")
        self.socket_name = socket_name or default_socket_name(self.resource_name)
        self._initial = list(devices) if devices is not None else None
        self._devices: Mapping[str, Device] = MappingProxyType({})
        self._generation = Generation()
        self._published = asyncio.Event()

    # -- device state -------------------------------------------------------------

    @property
    def devices(self) -> Mapping[str, Device]:
        """The published devices by ID, in publishing order (read-only)."""
        return self._devices

    @property
    def generation(self) -> int:
        """Bumped by every publish that changed something."""
        return self._generation.value

    @property
    def published(self) -> bool:
        return self._published.is_set()

    def publish(self, devices: Iterable[Device]) -> None:
        """Replace the whole device list; streams see it at once if anything changed."""
        table: dict[str, Device] = {}
        for device in devices:
            if device.id in table:
                raise ValueError(f"{self.resource_name}: device ID {device.id!r} published twice")
            table[device.id] = device
        if problem := device_limit_problem(self.resource_name, len(table), self.limits):
            log.error("%s", problem)
            table = dict(list(table.items())[: self.limits.max_devices])
        first = not self._published.is_set()
        self._published.set()
        if not first and list(table.items()) == list(self._devices.items()):
            return
        if not first:
            _tell_health_changes(self.resource_name, self._devices, table)
        self._devices = MappingProxyType(table)
        self._generation.bump()

    def set_health(self, device_id: str, healthy: bool, reason: str = "") -> None:
        """Mark one published device healthy or unhealthy (and why: `reason`)."""
        device = self._devices[device_id]
        if device.with_health(healthy, reason) is not device:
            self.publish(
                d.with_health(healthy, reason) if d.id == device_id else d
                for d in self.devices.values()
            )

    async def wait_published(self) -> None:
        await self._published.wait()

    async def wait_changed(self, generation: int) -> int:
        """Wait until the device list is newer than `generation`; return the new one."""
        return await self._generation.wait_newer(generation)

    # -- hooks ----------------------------------------------------------------------

    async def scan(self) -> None:
        """Discover devices and publish them; keep running to publish changes.

        The framework registers with the kubelet only after the first publish, so a pod
        admitted right after registration never meets an empty list. The default
        publishes the devices given to the constructor and returns.
        """
        if self._initial is None:
            raise NotImplementedError(f"{type(self).__name__} must pass devices or override scan()")
        self.publish(self._initial)

    async def allocate(self, devices: Sequence[Device]) -> ContainerEdits:
        """What one container needs for `devices` (validated: known, unique, healthy).

        Unless a subclass overrides it, the servicer writes this same answer straight
        into the response (`DevicePluginServicer._default_answer`)."""
        edits = merge_edits(devices)
        if self.ids_env:
            edits.env[self.ids_env] = ",".join([d.id for d in devices])
        return edits

    async def preferred(
        self, available: Sequence[Device], must_include: Sequence[Device], size: int
    ) -> Sequence[str]:
        """IDs to suggest for a container; called only if `preferred_allocation` is set.

        Arguments are validated: `must_include` is part of `available` and
        `len(must_include) <= size <= len(available)`. The answer must keep to those.
        """
        from devplug.framework.preferred import prefer_numa_local  # only where offered

        return prefer_numa_local(available, must_include, size)

    async def pre_start(self, devices: Sequence[Device]) -> None:
        """Prepare devices before a container starts (reset, warm up...)."""

    def node_labels(self) -> Mapping[str, str]:
        """Node labels that describe this resource (`name=value` lines of a
        node-feature-discovery feature file), derived from the published devices.

        Names are qualified (`example.com/widget.count`); the default gives none.
        """
        return {}

    @property
    def pre_start_required(self) -> bool:
        return type(self).pre_start is not Plugin.pre_start


def _tell_health_changes(
    resource: str, before: Mapping[str, Device], after: Mapping[str, Device]
) -> None:
    """One event for the devices whose health a publish changed (new devices count as
    changed when they arrive unhealthy)."""
    sick = [i for i, d in after.items() if not d.healthy and (i not in before or before[i].healthy)]
    well = [i for i, d in after.items() if d.healthy and i in before and not before[i].healthy]
    if not sick and not well:
        return
    parts = [
        f"{state}: {observe.show_ids(ids)}"
        for state, ids in (("unhealthy", sick), ("healthy", well))
        if ids
    ]
    observe.emit(
        observe.HEALTH_CHANGED,
        resource,
        "devices now " + "; ".join(parts),
        logging.WARNING if sick else logging.INFO,
        unhealthy=sick,
        healthy=well,
    )


def default_socket_name(resource_name: str) -> str:
    """A bare, stable file name for the resource's socket: 'example.com/kvm' ->
    'devplug-example.com-kvm.sock'."""
    return "devplug-" + resource_name.replace("/", "-") + ".sock"
