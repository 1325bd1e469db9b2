"""Reading USB and PCI devices the way the kernel lays them out in sysfs.

`<sysfs>/bus/{usb,pci}/devices/<name>` are symlinks into `<sysfs>/devices/...`; each
device folder holds its ID files (`idVendor`, `vendor`, `class`...), links (`driver`,
`iommu_group`) and, below it, the class devices it made (`tty/ttyUSB0`, `drm/card0`...),
whose `uevent` names their /dev node (`DEVNAME=dri/card0`). Walking a device's folder
for those `uevent` files finds every node it has, whatever its kind.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from devplug.framework.device import Attribute

_USB_DEVICE = re.compile(r"^\d+-[\d.]+$")
_USB_INTERFACE = re.compile(r"^\d+-[\d.]+:\d+\.\d+$")
_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_PCI_ROOT_BUS = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
_USB_ROOT_HUB = re.compile(r"^usb\d+$")
VFIO_DRIVER = "vfio-pci"


@dataclass(frozen=True, slots=True)
class SysDevice:
    """One USB or PCI device as sysfs shows it now."""

    kind: str  # "usb" or "pci"
    name: str  # its name in sysfs: '1-1.2', '0000:3b:00.0'
    path: Path  # its sysfs folder, resolved
    attributes: dict[str, Attribute]
    interfaces: dict[str, str] = field(default_factory=dict)  # USB interface -> class
    numa_node: int | None = None
    # The root bus ('pci0000:3a') and the PCI addresses from it down to the device.
    pci_path: tuple[str, ...] = ()


class Sysfs:
    """A sysfs tree and its /dev (`/sys` and `/dev`, or fake trees in a test)."""

    def __init__(self, root: Path | str = "/sys", dev_root: Path | str = "/dev") -> None:
        self.root = Path(root)
        self.dev_root = Path(dev_root)

    @property
    def is_real(self) -> bool:
        """Whether the root is a mounted sysfs (`/sys`, or the host's mounted elsewhere,
        such as `/host/sys` in a container), which makes no inotify events."""
        return filesystem_type(self.root) == "sysfs"

    def bus_folder(self, bus: str) -> Path:
        return self.root / "bus" / bus / "devices"

    def dev_path(self, devname: str) -> str:
        return str(self.dev_root / devname)

    # -- USB ---------------------------------------------------------------------------

    def usb_devices(self) -> list[SysDevice]:
        found = []
        for name in _names(self.bus_folder("usb")):
            if not _USB_DEVICE.match(name):  # interfaces ('1-1:1.0') and root hubs ('usb1')
                continue
            path = Path(os.path.realpath(self.bus_folder("usb") / name))
            if not path.is_dir():
                continue
            found.append(self._usb(name, path))
        return found

    def _usb(self, name: str, path: Path) -> SysDevice:
        vendor = _hex(_read(path / "idVendor"), 4)
        product = _hex(_read(path / "idProduct"), 4)
        attributes: dict[str, Attribute] = {}
        if vendor:
            attributes["vendorID"] = vendor
        if product:
            attributes["productID"] = product
        for key, file in (("serial", "serial"), ("model", "product"), ("vendor", "manufacturer")):
            if value := _read(path / file):
                attributes[key] = value
        interfaces: dict[str, str] = {}
        for entry in sorted(_names(path)):
            if _USB_INTERFACE.match(entry) and (path / entry).is_dir():
                interfaces[entry] = _hex(_read(path / entry / "bInterfaceClass"), 2)
        numa = _numa_of(path, self.root)
        if numa is not None:
            attributes["numaNode"] = numa
        return SysDevice("usb", name, path, attributes, interfaces, numa)

    # -- PCI ---------------------------------------------------------------------------

    def pci_devices(self) -> list[SysDevice]:
        found = []
        for name in _names(self.bus_folder("pci")):
            path = Path(os.path.realpath(self.bus_folder("pci") / name))
            if _PCI_ADDRESS.match(name) and path.is_dir():
                found.append(self._pci(name, path))
        return found

    def _pci(self, name: str, path: Path) -> SysDevice:
        attributes: dict[str, Attribute] = {"pciAddress": name}
        for key, file, digits in (
            ("vendorID", "vendor", 4),
            ("productID", "device", 4),
            ("pciClass", "class", 6),
        ):
            if value := _hex(_read(path / file), digits):
                attributes[key] = value
        driver = _link_name(path / "driver")
        if driver:
            attributes["driver"] = driver
        group = _link_name(path / "iommu_group")
        if group.isdigit():
            attributes["iommuGroup"] = int(group)
        numa = _numa_of(path, self.root)
        if numa is not None:
            attributes["numaNode"] = numa
        pci_path = tuple(p for p in path.parts if _PCI_ADDRESS.match(p) or _PCI_ROOT_BUS.match(p))
        return SysDevice("pci", name, path, attributes, {}, numa, pci_path)

    # -- nodes -------------------------------------------------------------------------

    def devnames(self, device: SysDevice, interfaces: Iterable[str] = ()) -> list[str]:
        """The /dev names of a device's nodes, relative to /dev ('ttyUSB0',
        'bus/usb/001/004'): a USB device's own and those of its `interfaces`, a PCI
        device's all. Walked only for the devices a selector keeps (the walk is the
        costly part of a look at sysfs)."""
        if device.kind == "usb":
            own = _devnames(device.path, own_only=True)
            return [*own, *(n for i in interfaces for n in _devnames(device.path / i))]
        return _devnames(device.path)


# -- helpers -------------------------------------------------------------------------------


def filesystem_type(path: Path | str) -> str:
    """The type of the file system `path` is on, from /proc/self/mountinfo ('' if
    unknown): the mount with the longest mount point that holds the path."""
    target = os.path.realpath(path)
    best, kind = "", ""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    for line in lines:
        fields = line.split(" ")
        if " - " not in line or len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, line.split(" - ", 1)[1].split(" ")[0]
    return kind


def _names(folder: Path) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return ""


def _hex(text: str, digits: int) -> str:
    """'10DE' / '0x10de' -> '0x10de' (zero-padded to `digits`); '' when not hex."""
    try:
        return f"0x{int(text, 16):0{digits}x}" if text else ""
    except ValueError:
        return ""


def _link_name(path: Path) -> str:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return ""


def _numa_of(path: Path, root: Path) -> int | None:
    """The NUMA node of the nearest folder at or above `path` that has one (a USB device
    takes its controller's); None when none says (or says -1)."""
    stop = Path(os.path.realpath(root))
    for folder in (path, *path.parents):
        if folder == stop or stop not in folder.parents:
            break
        text = _read(folder / "numa_node")
        if text:
            try:
                node = int(text)
            except ValueError:
                return None
            return node if node >= 0 else None
    return None


def _devnames(folder: Path, own_only: bool = False) -> list[str]:
    """The DEVNAMEs of the `uevent` files in `folder` and the class devices below it,
    not descending into other USB devices, root hubs (below a USB controller), USB
    interfaces (`own_only`) or PCI devices."""
    names: list[str] = []
    for current, dirs, files in os.walk(folder, followlinks=False):
        here = Path(current)
        if "uevent" in files and (devname := _uevent_devname(here / "uevent")):
            names.append(devname)
        dirs[:] = sorted(
            d
            for d in dirs
            if not _USB_DEVICE.match(d)
            and not _USB_ROOT_HUB.match(d)
            and not _PCI_ADDRESS.match(d)
            and not (own_only and _USB_INTERFACE.match(d))
            and d not in ("power", "subsystem", "driver", "firmware_node")
        )
    return names


def _uevent_devname(path: Path) -> str:
    for line in _read(path).splitlines():
        key, _, value = line.partition("=")
        if key == "DEVNAME" and value and ".." not in value.split("/"):
            return value.lstrip("/")
    return ""
