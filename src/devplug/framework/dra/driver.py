"""What a DRA driver is made of: a Plugin's devices, under a driver name, with hooks
for preparing the devices of a claim.

`DraDriver` is the one name a driver author needs: the base they subclass, alongside
`Plugin` and sharing `Device` and its container edits; the same class is served as a
device plugin, as a DRA driver, or both (`devplug.run(..., drivers=[...])`).

Inside the framework (not for driver authors): `DriverBinding` is how a driver is
served, any Plugin (a config-built one too) bound to a driver name with what the
config adds, so that the node plugin and the slice publisher deal with one kind of
object; `DriverHooks` is the part of a DraDriver it calls, which a source can also
give a config-built plugin (partitions, MIG instances made at prepare).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Protocol

from devplug.api.dra.constants import NUMA_NODE_ATTRIBUTE
from devplug.framework.device import Attribute, ContainerEdits, Device
from devplug.framework.dra.layout import Layout, Partition, partition_device
from devplug.framework.plugin import Plugin
from devplug.kube.dranames import default_driver_name, device_name, driver_name_problem

# The taint of an unhealthy device (a label key; its value the health reason).
UNHEALTHY_TAINT = "devplug.io/unhealthy"
TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")

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
    """One result of a claim's allocation that belongs to this driver and pool: with
    the share ID and consumed capacity of a share of a shared device."""

    request: str
    pool: str
    device: str
    share_id: str = ""
    consumed: Mapping[str, str] = field(default_factory=dict)
    admin_access: bool = False
    # The request's tolerations at allocation (DeviceToleration objects).
    tolerations: tuple[Mapping[str, object], ...] = ()


@dataclass(frozen=True, slots=True)
class Offer:
    """A device as the slices publish it: a physical device, or one partition of it.
    `device` is what the containers of a claim get."""

    name: str
    device: Device
    parent: Device
    layout: Layout | None = None
    partition: Partition | None = None

    @property
    def shared(self) -> bool:
        """Several claims may hold it at once (allowMultipleAllocations)."""
        return self.layout is not None and bool(self.layout.shared)

    @property
    def counter_set(self) -> str:
        """The counter set a partition consumes from: its parent's, named as the
        parent would be; "" for a whole device."""
        return device_name(self.parent.id) if self.partition is not None else ""


class DriverHooks(Protocol):
    """A DraDriver's hooks as a binding calls them: how each device is offered, and the
    work of preparing a claim's devices (a DraDriver's own, or what a source adds to a
    config-built plugin: partitions, MIG instances made at prepare)."""

    def layout(self, device: Device) -> Layout | None: ...

    async def prepare(self, claim: ClaimRef, devices: Sequence[Device]) -> ContainerEdits: ...

    async def unprepare(self, claim: ClaimRef, devices: Sequence[Device]) -> None: ...


class DraDriver(Plugin):
    """A Plugin that is also a DRA driver: set `driver_name` (or pass it), describe the
    devices as for a device plugin, and override `prepare` / `unprepare` to do more
    than hand out the devices' container edits, and `layout` to offer devices as
    partitions or shared capacity.
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

    def taints(self, device: Device, effect: str) -> list[dict[str, str]] | None:
        """The device's taints in the slices (resource.k8s.io/v1 DeviceTaint, without
        timeAdded), or None for the default: an unhealthy device gets
        `devplug.io/unhealthy` with `effect` and its health reason as the value."""
        return None

    def layout(self, device: Device) -> Layout | None:
        """How `device` is offered: as partitions, as shared capacity, or (None) as one
        device for one claim."""
        return None


@dataclass(slots=True)
class DriverBinding:
    """(Internal.) A plugin served as the DRA driver `name`, with slice attributes added from the
    config (`attributes`, for every device) and renamed (`attribute_names`), and its
    hooks (a DraDriver's own; without, each device is whole and gets what Allocate
    gives)."""

    plugin: Plugin
    name: str
    attributes: Mapping[str, Attribute] = field(default_factory=dict)
    attribute_names: Mapping[str, str] = field(default_factory=dict)
    # The effect of an unhealthy device's taint: NoSchedule, NoExecute or None.
    taint_effect: str = "NoSchedule"
    hooks: DriverHooks | None = None
    # The devices need nothing done on the node: the slices say so (skipNodeOperations).
    skip_node_operations: bool = False
    # Write each claim's device metadata file for its containers (KEP-5304).
    device_metadata: bool = False
    # The names of the devices prepared for a claim on this node (the Preparer keeps it).
    held: set[str] = field(default_factory=set)
    _offers: tuple[int, dict[str, Offer]] = field(
        default=(-1, {}), init=False, repr=False, compare=False
    )
    # Device ID -> (its taints, when it was first published with them, RFC 3339), so
    # that a taint keeps its timeAdded from one publish to the next.
    _tainted_since: dict[str, tuple[str, str]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def of(cls, plugin: Plugin) -> DriverBinding:
        """The driver of a DraDriver, or of a plain plugin under its default name."""
        if isinstance(plugin, DraDriver):
            return cls(plugin, plugin.driver_name, hooks=plugin)
        return cls(plugin, default_driver_name(plugin.resource_name))

    def __post_init__(self) -> None:
        if problem := driver_name_problem(self.name):
            raise ValueError(problem)
        if self.taint_effect not in TAINT_EFFECTS:
            raise ValueError(
                f"taint effect {self.taint_effect!r}: expected one of {', '.join(TAINT_EFFECTS)}"
            )
        self.attributes = MappingProxyType(dict(self.attributes))
        self.attribute_names = MappingProxyType(dict(self.attribute_names))
        if self.hooks is None and isinstance(self.plugin, DraDriver):
            self.hooks = self.plugin

    def layout(self, device: Device) -> Layout | None:
        return self.hooks.layout(device) if self.hooks is not None else None

    def offers(self) -> dict[str, Offer]:
        """What the slices publish, by device name: each device, or each partition in
        its place (kept until the plugin's devices change)."""
        generation = self.plugin.generation
        if self._offers[0] == generation:
            return self._offers[1]
        offers: dict[str, Offer] = {}
        for device in self.plugin.devices.values():
            layout = self.layout(device)
            if layout is None or not layout.partitions:
                name = device_name(device.id)
                offers[name] = Offer(name, device, device, layout)
                continue
            for partition in layout.partitions:
                part = partition_device(device, partition)
                name = device_name(part.id)
                offers[name] = Offer(name, part, device, layout, partition)
        self._offers = (generation, offers)
        return offers

    def describe(self, device: Device) -> tuple[dict[str, Attribute], dict[str, int]]:
        """A device's slice attributes and capacities, by their published names."""
        attributes: dict[str, Attribute] = {}
        capacity: dict[str, int] = {}
        if len(device.numa_nodes) == 1:
            # The driver's own name, as before, and the standard one beside it.
            attributes["numaNode"] = device.numa_nodes[0]
            attributes[NUMA_NODE_ATTRIBUTE] = device.numa_nodes[0]
        for key, value in {**device.attributes, **self.attributes}.items():
            name = self.attribute_names.get(key, key)
            if key in CAPACITY_ATTRIBUTES and isinstance(value, int):
                capacity[name] = value
            else:
                attributes[name] = value
        return attributes, capacity

    def taints(self, device: Device) -> list[dict[str, str]]:
        """The device's taints as a ResourceSlice carries them, timeAdded included."""
        custom = (
            self.plugin.taints(device, self.taint_effect)
            if isinstance(self.plugin, DraDriver)
            else None
        )
        if custom is None:
            custom = [] if device.healthy else [unhealthy_taint(device, self.taint_effect)]
        if not custom:
            self._tainted_since.pop(device.id, None)
            return []
        key = repr(custom)
        since = self._tainted_since.get(device.id)
        if since is None or since[0] != key:
            stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            since = self._tainted_since[device.id] = (key, stamp)
        return [{**taint, "timeAdded": since[1]} for taint in custom]

    async def prepare(self, claim: ClaimRef, devices: Sequence[Device]) -> ContainerEdits:
        if self.hooks is not None:
            return await self.hooks.prepare(claim, devices)
        return await self.plugin.allocate(devices)

    async def unprepare(self, claim: ClaimRef, devices: Sequence[Device]) -> None:
        if self.hooks is not None:
            await self.hooks.unprepare(claim, devices)


def unhealthy_taint(device: Device, effect: str) -> dict[str, str]:
    """devplug.io/unhealthy with `effect`, valued with the health reason if any."""
    from devplug.kube.names import label_value

    taint = {"key": UNHEALTHY_TAINT, "effect": effect}
    if value := label_value(device.health_reason):
        taint["value"] = value
    return taint


# The name older docs gave `DriverBinding` (`DraService([Driver.of(w)], ...)`), kept for
# code written from them; `devplug.run(..., drivers=[w])` needs neither.
Driver = DriverBinding
