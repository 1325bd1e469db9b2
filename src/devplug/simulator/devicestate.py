"""The device manager's records: a resource's devices and endpoint, one container's
allocation of a resource, the Allocate duration histogram, and the errors of
admission.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.simulator.endpoint import Endpoint
from devplug.simulator.results import AllocDuration

# The buckets of kubelet_device_plugin_alloc_duration_seconds (Prometheus defaults).
ALLOC_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class AdmissionError(Exception):
    """Allocation for a container failed; the text is the kubelet's error."""


@dataclass(frozen=True, slots=True)
class Rejection:
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    id: str
    healthy: bool
    numa_nodes: tuple[int, ...]


@dataclass(slots=True)
class ResourceState:
    """One resource's devices. `devices`, `healthy` and `unhealthy` change through
    `set_devices` and `mark_unhealthy` only, which keep the derived views up to date."""

    endpoint: Endpoint
    # every device the plugin listed last (allDevices), in its order
    devices: dict[str, DeviceInfo] = field(default_factory=dict)
    healthy: set[str] = field(default_factory=set)
    unhealthy: set[str] = field(default_factory=set)
    watch: asyncio.Task[None] | None = None
    # the endpoint whose list `devices` is (None: restored, or not listed yet)
    listed_by: Endpoint | None = None
    expiry: asyncio.TimerHandle | None = None
    expires_at: float | None = None
    # derived: the healthy devices in listing order, each device's NUMA nodes, and
    # whether any device reports one
    healthy_ids: list[str] = field(default_factory=list)
    topology: dict[str, tuple[int, ...]] = field(default_factory=dict)
    has_topology: bool = False

    @property
    def capacity(self) -> int:
        return len(self.healthy) + len(self.unhealthy)

    def ordered(self, ids: Iterable[str]) -> list[str]:
        """`ids` in the plugin's listing order (unknown ones last, by name)."""
        wanted = set(ids)
        known = [d for d in self.devices if d in wanted]
        return known + sorted(wanted - set(known))

    def set_devices(self, devices: Iterable[DeviceInfo]) -> None:
        """Replace the device list (a ListAndWatch message)."""
        self.devices = {d.id: d for d in devices}
        self.healthy = {d.id for d in self.devices.values() if d.healthy}
        self.unhealthy = set(self.devices) - self.healthy
        self.topology = {d.id: d.numa_nodes for d in self.devices.values()}
        self.has_topology = any(self.topology.values())
        self.healthy_ids = self.ordered(self.healthy)

    def mark_unhealthy(self) -> None:
        """Every device unhealthy (the plugin went away); capacity stays."""
        self.unhealthy |= self.healthy
        self.healthy = set()
        self.healthy_ids = []


@dataclass(slots=True)
class Allocation:
    """The devices of one resource held by one container (a checkpoint entry)."""

    numa: dict[int, list[str]]
    response: pb.ContainerAllocateResponse | None

    def ids(self) -> list[str]:
        seen: dict[str, None] = {}
        for node in sorted(self.numa):
            for device_id in self.numa[node]:
                seen[device_id] = None
        return list(seen)


@dataclass(slots=True)
class Histogram:
    count: int = 0
    total: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * len(ALLOC_BUCKETS))

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        for i, bound in enumerate(ALLOC_BUCKETS):
            if seconds <= bound:
                self.buckets[i] += 1

    def snapshot(self) -> AllocDuration:
        return AllocDuration(
            self.count, self.total, list(zip(ALLOC_BUCKETS, self.buckets, strict=True))
        )


# Called with (kind, resource, detail) on every change worth telling.
EventSink = Callable[[str, str, str], None]
