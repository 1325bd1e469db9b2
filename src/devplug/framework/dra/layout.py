"""How one physical device is offered through DRA beyond "one device, one claim".

Two shapes, both beta and on by default in Kubernetes 1.36:

- **Partitions** (DRAPartitionableDevices): the device's `counters` are published as a
  counter set of its own (in a slice that holds only counter sets), and each partition
  is a slice device that `consumes` some of them. The scheduler never lets allocated
  partitions consume more than a counter holds, so partitions that share a counter
  (one slot, one memory slice) are never allocated together.
- **Shared capacity** (DRAConsumableCapacity): the device is published once with
  `allowMultipleAllocations`; each claim consumes part of its capacities (GiB of
  memory, Gbit/s of a link) within a request policy, and gets a share ID.

A `Layout` describes either for one device; a driver maps each of its devices to a
layout (or to none: one device, one claim).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from devplug.api.constants import MAX_DEVICE_ID_LENGTH
from devplug.framework.device import Attribute, Device


@dataclass(frozen=True, slots=True)
class Partition:
    """One way to use part of a device: a slice device of its own that consumes
    `consumes` of the device's counters. The containers get the device's nodes and
    mounts, plus `env`."""

    name: str  # a DNS label, unique among the device's partitions
    consumes: Mapping[str, int]
    attributes: Mapping[str, Attribute] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "consumes", MappingProxyType(dict(self.consumes)))
        object.__setattr__(self, "attributes", MappingProxyType(dict(self.attributes)))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))


@dataclass(frozen=True, slots=True)
class RequestPolicy:
    """How much of a shared capacity one claim may consume (the API's
    `capacity.requestPolicy`): `default` when the claim names no amount, and either a
    list of valid amounts or a range. Quantities as the API writes them ('1Gi')."""

    default: str
    valid_values: tuple[str, ...] = ()
    min: str | None = None
    max: str | None = None
    step: str | None = None

    def body(self) -> dict[str, Any]:
        policy: dict[str, Any] = {"default": self.default}
        if self.valid_values:
            policy["validValues"] = list(self.valid_values)
        elif self.min is not None:
            bounds = {"min": self.min, "max": self.max, "step": self.step}
            policy["validRange"] = {k: v for k, v in bounds.items() if v is not None}
        return policy


@dataclass(frozen=True, slots=True)
class SharedCapacity:
    """A capacity that claims consume: `value` (a quantity), or None for the device's
    own capacity of that name (its `memory`)."""

    value: str | None = None
    policy: RequestPolicy | None = None


@dataclass(frozen=True, slots=True)
class Layout:
    """Partitions over `counters`, or capacities shared by several claims."""

    counters: Mapping[str, int] = field(default_factory=dict)
    partitions: tuple[Partition, ...] = ()
    shared: Mapping[str, SharedCapacity] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "counters", MappingProxyType(dict(self.counters)))
        object.__setattr__(self, "partitions", tuple(self.partitions))
        object.__setattr__(self, "shared", MappingProxyType(dict(self.shared)))
        if self.partitions and self.shared:
            raise ValueError("a layout has partitions or shared capacity, not both")
        for partition in self.partitions:
            unknown = set(partition.consumes) - set(self.counters)
            if unknown:
                raise ValueError(
                    f"partition {partition.name!r} consumes unknown counters {sorted(unknown)}"
                )


def slot_layout(slots: int, sizes: Iterable[int]) -> Layout:
    """A device with `slots` equal slots offered as aligned partitions of each size:
    4 slots with sizes 1, 2 and 4 give slot-0..slot-3, slots-0-1, slots-2-3 and
    slots-0-3. Each slot is a counter of 1, so partitions that share a slot exclude
    each other."""
    partitions = []
    for size in sorted(set(sizes)):
        for first in range(0, slots - size + 1, size):
            last = first + size - 1
            partitions.append(
                Partition(
                    f"slot-{first}" if size == 1 else f"slots-{first}-{last}",
                    {f"slot-{i}": 1 for i in range(first, last + 1)},
                    {"slots": size, "firstSlot": first},
                )
            )
    return Layout({f"slot-{i}": 1 for i in range(slots)}, tuple(partitions))


def partition_device(device: Device, partition: Partition) -> Device:
    """The device the containers of a claim get for `partition` of `device`: its
    nodes and mounts, its env and the partition's, its attributes and the partition's,
    under an ID of its own."""
    return device.replace(
        id=partition_id(device.id, partition.name),
        env={**device.env, **partition.env},
        attributes={**device.attributes, **partition.attributes},
    )


def partition_id(device_id: str, partition: str) -> str:
    """'<device ID>-<partition>', shortened with a hash where too long for an ID."""
    full = f"{device_id}-{partition}"
    if len(full) <= MAX_DEVICE_ID_LENGTH:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:10]
    return f"{full[: MAX_DEVICE_ID_LENGTH - 11]}-{digest}"


def counter_set(name: str, counters: Mapping[str, int]) -> dict[str, Any]:
    """A CounterSet of a ResourceSlice."""
    return {"name": name, "counters": {k: {"value": str(v)} for k, v in counters.items()}}


def consumption(counter_set_name: str, partition: Partition) -> list[dict[str, Any]]:
    """A partition's `consumesCounters`."""
    counters = {k: {"value": str(v)} for k, v in partition.consumes.items()}
    return [{"counterSet": counter_set_name, "counters": counters}]


def shared_capacity(layout: Layout, own: Mapping[str, int]) -> dict[str, dict[str, Any]]:
    """The `capacity` entries of a shared device: each shared capacity with its value
    (the layout's, else the device's own) and request policy."""
    capacity: dict[str, dict[str, Any]] = {}
    for name, shared in layout.shared.items():
        value = shared.value if shared.value is not None else str(own.get(name, 0))
        entry: dict[str, Any] = {"value": value}
        if shared.policy is not None:
            entry["requestPolicy"] = shared.policy.body()
        capacity[name] = entry
    return capacity


def overlapping(
    layout: Layout, taken: Sequence[Mapping[str, int]], wanted: Mapping[str, int]
) -> list[str]:
    """The counters that `wanted` would push past the layout's value, given what the
    partitions in `taken` consume already."""
    used: dict[str, int] = {}
    for consumes in (*taken, wanted):
        for counter, amount in consumes.items():
            used[counter] = used.get(counter, 0) + amount
    return sorted(c for c in wanted if used[c] > layout.counters.get(c, 0))
