"""devplug: Kubernetes device plugins in Python.

The public namespace holds what a plugin author needs:

    from devplug import Device, DeviceNode, Plugin, run

    class Widgets(Plugin):
        resource_name = "example.com/widget"

        async def scan(self) -> None:
            self.publish([Device("widget0", nodes=[DeviceNode("/dev/widget0")])])

    run(Widgets())

Names are loaded on first use, so that importing one submodule (the CLI, the config
checker) does not pull in gRPC and asyncio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from devplug.ground.lazy import lazy_exports

if TYPE_CHECKING:
    from devplug.api.constants import HEALTHY, UNHEALTHY, VERSION
    from devplug.framework.daemon import Daemon, run, serve
    from devplug.framework.device import ContainerEdits, Device, DeviceNode, Mount, merge_edits
    from devplug.framework.plugin import AllocationError, Plugin

_EXPORTS = {
    "HEALTHY": "devplug.api.constants",
    "UNHEALTHY": "devplug.api.constants",
    "VERSION": "devplug.api.constants",
    "AllocationError": "devplug.framework.plugin",
    "ContainerEdits": "devplug.framework.device",
    "Daemon": "devplug.framework.daemon",
    "Device": "devplug.framework.device",
    "DeviceNode": "devplug.framework.device",
    "Mount": "devplug.framework.device",
    "Plugin": "devplug.framework.plugin",
    "merge_edits": "devplug.framework.device",
    "run": "devplug.framework.daemon",
    "serve": "devplug.framework.daemon",
}

__all__ = [
    "HEALTHY",
    "UNHEALTHY",
    "VERSION",
    "AllocationError",
    "ContainerEdits",
    "Daemon",
    "Device",
    "DeviceNode",
    "Mount",
    "Plugin",
    "merge_edits",
    "run",
    "serve",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
