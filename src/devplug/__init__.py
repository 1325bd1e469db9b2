"""devplug: Kubernetes device plugins in Python.

The public namespace holds what a plugin author needs:

    from devplug import Device, DeviceNode, Plugin, run

    class Widgets(Plugin):
        resource_name = "example.com/widget"

        async def scan(self) -> None:
            self.publish([Device("widget0", nodes=[DeviceNode("/dev/widget0")])])

    run(Widgets())
"""

from devplug.api.constants import HEALTHY, UNHEALTHY, VERSION
from devplug.framework.daemon import Daemon, run, serve
from devplug.framework.device import ContainerEdits, Device, DeviceNode, Mount, merge_edits
from devplug.framework.plugin import AllocationError, Plugin

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
