"""The DRA driver of a config-built plugin: its name and attributes from the entry's
`dra:` block, and the hooks that offer its devices as the block says (whole, as
partitions, with shared capacity, or as MIG partitions of a GPU). The DRA framework
loads only when a driver is built."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from devplug.config.dra import CapacitySpec, DraSpec, Quantity, plugin_driver_name

if TYPE_CHECKING:
    from devplug.framework.device import ContainerEdits, Device
    from devplug.framework.dra.driver import ClaimRef, DriverBinding
    from devplug.framework.dra.layout import Layout
    from devplug.framework.plugin import Plugin


class ConfigLayout:
    """The hooks of a config-built plugin whose `dra` block shapes its devices: each
    device offered as the config says, prepared with what Allocate gives."""

    def __init__(self, plugin: Plugin, layout: Callable[[Device], Layout | None]) -> None:
        self.plugin = plugin
        self.layout = layout

    async def prepare(self, claim: ClaimRef, devices: Sequence[Device]) -> ContainerEdits:
        return await self.plugin.allocate(devices)

    async def unprepare(self, claim: ClaimRef, devices: Sequence[Device]) -> None:
        return None


def layout_of(spec: DraSpec | None) -> Callable[[Device], Layout | None] | None:
    """How the config offers each device: as partitions, with shared capacity, or
    (None) whole."""
    if spec is None or (spec.partitions is None and not spec.consumable_capacity):
        return None
    from devplug.framework.dra import layout

    if spec.partitions is not None:
        parts = spec.partitions
        if parts.slots is not None:
            shape = layout.slot_layout(parts.slots, parts.sizes)
        else:
            shape = layout.Layout(
                parts.counters,
                tuple(
                    layout.Partition(p.name, p.consumes, p.attributes, p.env) for p in parts.devices
                ),
            )
        return lambda device: shape

    shared = {name: _shared(c) for name, c in spec.consumable_capacity.items()}
    sharing = layout.Layout(shared=shared)
    own = [name for name, c in shared.items() if c.value is None]

    def shared_layout(device: Device) -> Layout | None:
        # A device without a capacity the config shares is offered whole.
        return sharing if all(isinstance(device.attributes.get(n), int) for n in own) else None

    return shared_layout


def _shared(spec: CapacitySpec) -> Any:
    from devplug.framework.dra.layout import RequestPolicy, SharedCapacity

    policy = spec.request_policy
    if policy is None:
        return SharedCapacity(_text(spec.value))
    bounds = policy.valid_range
    return SharedCapacity(
        _text(spec.value),
        RequestPolicy(
            str(policy.default),
            tuple(str(v) for v in policy.valid_values),
            _text(bounds.min) if bounds else None,
            _text(bounds.max) if bounds else None,
            _text(bounds.step) if bounds else None,
        ),
    )


def _text(value: Quantity | None) -> str | None:
    return None if value is None else str(value)


def config_driver(plugin: Any) -> DriverBinding:
    """The DRA driver of a config-built plugin (its `spec` is its config entry)."""
    from devplug.framework.dra.driver import DriverBinding

    spec = plugin.spec
    driver = DriverBinding(
        plugin,
        plugin_driver_name(plugin.resource_name, spec.name, spec.dra),
        spec.dra.attributes if spec.dra else {},
        spec.dra.attribute_names if spec.dra else {},
        spec.dra.taint_effect if spec.dra else "NoSchedule",
        skip_node_operations=spec.dra.skip_node_operations if spec.dra else False,
        device_metadata=spec.dra.device_metadata if spec.dra else False,
    )
    if spec.dra is not None and spec.dra.partitions is not None and spec.dra.partitions.mig:
        from devplug.sources.nvidia.partitions import MigPartitions

        driver.hooks = MigPartitions(plugin, lambda: driver.held)
    elif (shape := layout_of(spec.dra)) is not None:
        driver.hooks = ConfigLayout(plugin, shape)
    return driver
