"""What a DRA driver is made of: a Plugin's devices, under a driver name, with hooks
for preparing the devices of a claim.

`DraDriver` is the base a driver author subclasses, alongside `Plugin` and sharing
`Device` and its container edits: the same class is served as a device plugin, as a
DRA driver, or both. `Driver` binds any Plugin (a config-built one too) to a driver
name, so the node plugin and the slice publisher deal with one kind of object.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from devplug.framework.device import Attribute, ContainerEdits, Device
from devplug.framework.dra.names import default_driver_name, device_name, driver_name_problem
from devplug.framework.plugin import Plugin

# Device attributes that a ResourceSlice carries as capacities (quantities a CEL
# selector compares, `device.capacity["<driver>"].memory`), not as attributes.
CAPACITY_ATTRIBUTES = frozenset({"memory"})


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A ResourceClaim as the kubelet names it in NodePrepareResources."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One result of a claim's allocation that belongs to this driver and pool."""

    request: str
    pool: str
    device: str


class DraDriver(Plugin):
    """A Plugin that is also a DRA driver: set `driver_name` (or pass it), describe the
    devices as for a device plugin, and override `prepare` / `unprepare` to do more
    than hand out the devices' container edits.
    """

    driver_name: str = ""

    def __init__(
        self,
        resource_name: str | None = None,
        devices: Iterable[Device] | None = None,
        *,
        driver_name: str | None = None,
        socket_name: str | None = None,
    ) -> None:
        super().__init__(resource_name, devices, socket_name=socket_name)
        if driver_name is not None:
            self.driver_name = driver_name
        if not self.driver_name:
            self.driver_name = default_driver_name(self.resource_name)
        if problem := driver_name_problem(self.driver_name):
            raise ValueError(problem)

    async def prepare(self, claim: ClaimRef, devices: Sequence[Device]) -> ContainerEdits:
        """What the containers of a claim get for its `devices` (known and healthy);
        the default is what Allocate would give them. Raise to fail the claim."""
        return await self.allocate(devices)

    async def unprepare(self, claim: ClaimRef, devices: Sequence[Device]) -> None:
        """Undo `prepare` (devices that are gone meanwhile are left out)."""


@dataclass(slots=True)
class Driver:
    """A plugin served as the DRA driver `name`, with slice attributes added from the
    config (`attributes`, for every device) and renamed (`attribute_names`)."""

    plugin: Plugin
    name: str
    attributes: Mapping[str, Attribute] = field(default_factory=dict)
    attribute_names: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if problem := driver_name_problem(self.name):
            raise ValueError(problem)
        self.attributes = MappingProxyType(dict(self.attributes))
        self.attribute_names = MappingProxyType(dict(self.attribute_names))

    @classmethod
    def of(cls, plugin: Plugin) -> Driver:
        """The driver of a DraDriver, or of a plain plugin under its default name."""
        name = plugin.driver_name if isinstance(plugin, DraDriver) else ""
        return cls(plugin, name or default_driver_name(plugin.resource_name))

    def devices_by_name(self) -> dict[str, Device]:
        """The published devices by their name in the slices."""
        return {device_name(d.id): d for d in self.plugin.devices.values()}

    def describe(self, device: Device) -> tuple[dict[str, Attribute], dict[str, int]]:
        """A device's slice attributes and capacities, by their published names."""
        attributes: dict[str, Attribute] = {}
        capacity: dict[str, int] = {}
        if len(device.numa_nodes) == 1:
            attributes["numaNode"] = device.numa_nodes[0]
        for key, value in {**device.attributes, **self.attributes}.items():
            name = self.attribute_names.get(key, key)
            if key in CAPACITY_ATTRIBUTES and isinstance(value, int):
                capacity[name] = value
            else:
                attributes[name] = value
        return attributes, capacity

    async def prepare(self, claim: ClaimRef, devices: Sequence[Device]) -> ContainerEdits:
        if isinstance(self.plugin, DraDriver):
            return await self.plugin.prepare(claim, devices)
        return await self.plugin.allocate(devices)

    async def unprepare(self, claim: ClaimRef, devices: Sequence[Device]) -> None:
        if isinstance(self.plugin, DraDriver):
            await self.plugin.unprepare(claim, devices)
