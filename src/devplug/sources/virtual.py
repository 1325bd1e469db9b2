"""Virtual devices: IDs with no host node, for tests, demos and scheduling experiments."""

from __future__ import annotations

from collections.abc import Mapping

from devplug.config.ids import ids_env_name, replica_ids, virtual_device_id
from devplug.config.resource import ResourceSpec
from devplug.framework.device import Device
from devplug.outputs.nfd import device_labels
from devplug.sources.protocol import SourcePlugin


class VirtualPlugin(SourcePlugin):
    """Serves `virtual` always-healthy devices named '<resource short name>-<index>'."""

    kind = "virtual"

    def __init__(self, spec: ResourceSpec) -> None:
        if spec.virtual is None:
            raise ValueError(f"{spec.name}: a virtual resource needs 'virtual'")
        super().__init__(spec.name)
        self.spec = spec
        self.ids_env = ids_env_name(spec.name)
        self.preferred_allocation = spec.preferred_allocation

    def discover(self) -> list[Device]:
        assert self.spec.virtual is not None
        return [
            Device(device_id)
            for i in range(self.spec.virtual)
            for device_id in replica_ids(virtual_device_id(self.spec.name, i), self.spec.count)
        ]

    async def scan(self) -> None:
        self.publish(self.discover())

    def node_labels(self) -> Mapping[str, str]:
        return device_labels(self.resource_name, self.devices.values())
