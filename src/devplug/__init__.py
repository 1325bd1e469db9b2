"""devplug: Kubernetes device plugins and DRA drivers in Python.

The public namespace holds what a plugin or driver author needs, behind one door:

    from devplug import Device, DeviceNode, DraDriver, Plugin, run

    class Gadgets(Plugin):                    # pods ask for a count
        resource_name = "example.com/gadget"

        async def scan(self) -> None:
            self.publish([Device("gadget0", nodes=[DeviceNode("/dev/gadget0")])])

    class Widgets(DraDriver):                 # pods ask with a ResourceClaim
        resource_name = "example.com/widget"  # driver widget.example.com

        async def scan(self) -> None:
            self.publish([Device("widget0", nodes=[DeviceNode("/dev/widget0")])])

    run(Gadgets(), drivers=[Widgets()])       # device plugins first, DRA drivers after

The same object may be given both ways (`run(w, drivers=[w])`): it is scanned once and
served as both. Names are loaded on first use, so that importing one submodule (the
CLI, the config checker) does not pull in gRPC and asyncio, and the DRA modules load
only when a driver is served.

Everything else under `devplug.framework` is the framework's own (the daemon's
services, the wire adapters, the DRA node plugin and slice publisher): importable,
but not part of this door.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from devplug.ground.lazy import lazy_exports

if TYPE_CHECKING:
    from devplug.api.constants import HEALTHY, UNHEALTHY, VERSION
    from devplug.framework.daemon import Daemon, run, serve
    from devplug.framework.device import ContainerEdits, Device, DeviceNode, Mount, merge_edits
    from devplug.framework.dra.driver import ClaimRef, DraDriver
    from devplug.framework.dra.layout import Layout, Partition
    from devplug.framework.dra.service import DraSettings
    from devplug.framework.limits import Limits
    from devplug.framework.plugin import AllocationError, Plugin

_EXPORTS = {
    "HEALTHY": "devplug.api.constants",
    "UNHEALTHY": "devplug.api.constants",
    "VERSION": "devplug.api.constants",
    "AllocationError": "devplug.framework.plugin",
    "ClaimRef": "devplug.framework.dra.driver",
    "ContainerEdits": "devplug.framework.device",
    "Daemon": "devplug.framework.daemon",
    "Device": "devplug.framework.device",
    "DeviceNode": "devplug.framework.device",
    "DraDriver": "devplug.framework.dra.driver",
    "DraSettings": "devplug.framework.dra.service",
    "Layout": "devplug.framework.dra.layout",
    "Limits": "devplug.framework.limits",
    "Mount": "devplug.framework.device",
    "Partition": "devplug.framework.dra.layout",
    "Plugin": "devplug.framework.plugin",
    "merge_edits": "devplug.framework.device",
    "run": "devplug.framework.daemon",
    "serve": "devplug.framework.daemon",
}

# The door: `run` (and `serve`, the same inside your own event loop); a device plugin's
# Plugin, Device and its edits (DeviceNode, Mount, ContainerEdits, merge_edits),
# AllocationError to refuse a request, Limits; a DRA driver's DraDriver, ClaimRef,
# Layout and Partition, DraSettings. `Daemon` is for a program that runs services of
# its own beside the plugins.
__all__ = [
    "HEALTHY",
    "UNHEALTHY",
    "VERSION",
    "AllocationError",
    "ClaimRef",
    "ContainerEdits",
    "Daemon",
    "Device",
    "DeviceNode",
    "DraDriver",
    "DraSettings",
    "Layout",
    "Limits",
    "Mount",
    "Partition",
    "Plugin",
    "merge_edits",
    "run",
    "serve",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
