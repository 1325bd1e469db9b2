"""DRA drivers: the same devices as a device plugin, described in ResourceSlices and
prepared per claim. Imported only when something is served through DRA."""

from devplug.framework.dra.driver import AllocatedDevice, ClaimRef, DraDriver, Driver
from devplug.framework.dra.service import DraService, DraSettings

__all__ = ["AllocatedDevice", "ClaimRef", "DraDriver", "DraService", "DraSettings", "Driver"]
