"""DRA drivers: the same devices as a device plugin, described in ResourceSlices and
prepared per claim. Imported only when something is served through DRA.

A driver author needs `DraDriver` and `ClaimRef` (and `DraSettings` for `run`), all
exported from `devplug`; `Layout` and `Partition` (devplug.framework.dra.layout) for
a driver that offers partitions. The rest is the framework's own: `DriverBinding`
(`Driver`, its old name) and `DraService` are what `devplug.run` builds from
`drivers=[...]`.
"""

from devplug.framework.dra.driver import (
    AllocatedDevice,
    ClaimRef,
    DraDriver,
    Driver,
    DriverBinding,
)
from devplug.framework.dra.service import DraService, DraSettings

# For driver authors: AllocatedDevice, ClaimRef, DraDriver, DraSettings. Internal, what
# devplug.run builds from drivers=[...]: DraService, DriverBinding (Driver, its old name).
__all__ = [
    "AllocatedDevice",
    "ClaimRef",
    "DraDriver",
    "DraService",
    "DraSettings",
    "Driver",
    "DriverBinding",
]
