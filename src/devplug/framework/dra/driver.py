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
from datetime import UTC, datetime
from types import MappingProxyType

from devplug.framework.device import Attribute, ContainerEdits, Device
from devplug.framework.dra.names import default_driver_name, device_name, driver_name_problem
from devplug.framework.plugin import Plugin

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
    """One result of a claim's allocation that belongs to this driver and pool."""

    request: str
    pool: str
    device: str
    # The request's tolerations at allocation (DeviceToleration objects).
    tolerations: tuple[Mapping[str, object], ...] = ()


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

    def taints(self, device: Device, effect: str) -> list[dict[str, str]] | None:
        """The device's taints in the slices (resource.k8s.io/v1 DeviceTaint, without
        timeAdded), or None for the default: an unhealthy device gets
        `devplug.io/unhealthy` with `effect` and its health reason as the value."""
        return None


@dataclass(slots=True)
class Driver:
    """A plugin served as the DRA driver `name`, with slice attributes added from the
    config (`attributes`, for every device) and renamed (`attribute_names`)."""

    plugin: Plugin
    name: str
    attributes: Mapping[str, Attribute] = field(default_factory=dict)
    attribute_names: Mapping[str, str] = field(default_factory=dict)
    # The effect of an unhealthy device's taint: NoSchedule, NoExecute or None.
    taint_effect: str = "NoSchedule"
    # Device ID -> when it was first published with its current taints (RFC 3339), so
    # that a taint keeps its timeAdded from one publish to the next.
    _tainted_since: dict[str, tuple[str, str]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if problem := driver_name_problem(self.name):
            raise ValueError(problem)
        if self.taint_effect not in TAINT_EFFECTS:
            raise ValueError(
                f"taint effect {self.taint_effect!r}: expected one of {', '.join(TAINT_EFFECTS)}"
            )
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
        if isinstance(self.plugin, DraDriver):
            return await self.plugin.prepare(claim, devices)
        return await self.plugin.allocate(devices)

    async def unprepare(self, claim: ClaimRef, devices: Sequence[Device]) -> None:
        if isinstance(self.plugin, DraDriver):
            await self.plugin.unprepare(claim, devices)


def unhealthy_taint(device: Device, effect: str) -> dict[str, str]:
    """devplug.io/unhealthy with `effect`, valued with the health reason if any."""
    from devplug.outputs.nfd import label_value

    taint = {"key": UNHEALTHY_TAINT, "effect": effect}
    if value := label_value(device.health_reason):
        taint["value"] = value
    return taint


def tolerates(tolerations: Sequence[Mapping[str, object]], taint: Mapping[str, str]) -> bool:
    """Whether one of `tolerations` (resource.k8s.io/v1 DeviceToleration) tolerates
    `taint`, by the API's rules: an empty effect matches every effect; Exists with an
    empty key matches every key; Equal (the default) needs key and value to match."""
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key") or ""
        if (toleration.get("operator") or "Equal") == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (toleration.get("value") or "") == taint.get("value", ""):
            return True
    return False
