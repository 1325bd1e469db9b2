"""Fake sysfs and /dev trees laid out like the kernel's, for tests and benchmarks.

Device folders live under `sys/devices/pci<domain>:<root bus>/...`;
`sys/bus/{usb,pci}/devices/<name>`, `sys/class/<class>/<name>`, `sys/dev/char/M:m`,
`driver`, `subsystem` and `iommu_group` are real relative symlinks into them. Class
devices sit where their drivers put them: a usb-serial port's tty at
`1-1:1.0/ttyUSB0/tty/ttyUSB0` (cdc-acm's at `1-1:1.0/tty/ttyACM0`), a sound card's
nodes at `sound/card1/controlC1`, a HID device's at `0003:VVVV:PPPP.NNNN/hidraw/hidraw0`,
DRM's at `drm/card1`, vfio's under `devices/virtual`. Every device folder has a `uevent`
file; only those with a node name it (`DEVNAME=`). Nodes are real character devices
made with mknod (root needed). A device is added the kernel's way round (folders, then
its bus link, then its nodes) and removed the other way round, so a watcher sees a
complete device or none.

    tree = FakeSysfs(tmp_path)
    tree.add_usb("1-1", "0403", "6010", serial="FT1", interfaces=[
        UsbInterface("ff", [Node("tty", "ttyUSB0", 188, 0)]),
        UsbInterface("ff", [Node("tty", "ttyUSB1", 188, 1)])])
    tree.add_pci("0000:3b:00.0", "10ee", "500c", numa_node=0, driver="xclmgmt")
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

USB_CONTROLLER = "0000:00:14.0"
VFIO_MAJOR = 10
VFIO_MINOR = 196
VFIO_GROUP_MAJOR = 243
USB_MAJOR = 189
# The device between an interface and a class device, by class: (sysfs folder, name)
# that its `subsystem` link points into.
_MIDDLE = {"tty": ("bus", "usb-serial"), "sound": ("class", "sound"), "hidraw": ("bus", "hid")}


@dataclass(frozen=True)
class Node:
    """A class device and its /dev node: subsystem folder name, DEVNAME, numbers."""

    subsystem: str  # 'tty', 'video4linux', 'hidraw', 'sound', 'drm'
    devname: str  # relative to /dev: 'ttyUSB0', 'dri/card0', 'snd/controlC1'
    major: int
    minor: int

    @property
    def name(self) -> str:
        return os.path.basename(self.devname)

    def folder(self, parent: Path, hid: str) -> Path:
        """Where the kernel puts this class device below its USB interface or PCI
        device (`hid`: the name of the interface's HID device)."""
        if self.subsystem == "tty" and self.name.startswith("ttyUSB"):
            return parent / self.name / "tty" / self.name  # a usb-serial port
        if self.subsystem == "sound":
            card = re.search(r"C(\d+)", self.name)
            return parent / "sound" / f"card{card.group(1) if card else 0}" / self.name
        if self.subsystem == "hidraw":
            return parent / hid / "hidraw" / self.name
        return parent / self.subsystem / self.name


@dataclass(frozen=True)
class UsbInterface:
    interface_class: str  # hex, e.g. 'ff', '0e', '08'
    nodes: list[Node] = field(default_factory=list)


class FakeSysfs:
    def __init__(self, base: Path | str, *, usb_numa_node: int = 0) -> None:
        self.base = Path(base)
        self.sys = self.base / "sys"
        self.dev = self.base / "dev"
        for folder in (
            "bus/usb/devices",
            "bus/pci/devices",
            "bus/pci/drivers",
            "dev/char",
            "class",
        ):
            (self.sys / folder).mkdir(parents=True, exist_ok=True)
        (self.sys / "kernel" / "iommu_groups").mkdir(parents=True, exist_ok=True)
        self.dev.mkdir(parents=True, exist_ok=True)
        self._nodes: dict[str, list[Node]] = {}
        self._hid_count = 0
        # The USB controller: a PCI device whose NUMA node its USB devices share.
        self.controller = self.sys / "devices" / "pci0000:00" / USB_CONTROLLER
        self._files(
            self.controller,
            {
                "vendor": "0x8086",
                "device": "0xa36d",
                "class": "0x0c0330",
                "numa_node": str(usb_numa_node),
            },
        )
        self._device(self.controller, "pci", {"PCI_SLOT_NAME": USB_CONTROLLER})
        self._link(self.sys / "bus/pci/devices" / USB_CONTROLLER, self.controller)
        self._add_hub()

    def _add_hub(self) -> None:
        """The root hub of bus 1, a USB device with a node of its own."""
        hub = self.controller / "usb1"
        self._files(hub, {"idVendor": "1d6b", "idProduct": "0002", "busnum": "1", "devnum": "1"})
        self._device(hub, "usb", {"DEVTYPE": "usb_device"})
        node = Node("usb", "bus/usb/001/001", USB_MAJOR, 0)
        self._class_device(hub, node, in_place=True)
        self._link(self.sys / "bus/usb/devices/usb1", hub)
        self._make_nodes("usb1", [node])

    # -- USB -------------------------------------------------------------------------

    def add_usb(
        self,
        port: str,
        vendor: str,
        product: str,
        *,
        serial: str | None = None,
        model: str | None = None,
        manufacturer: str | None = None,
        interfaces: list[UsbInterface] = (),  # type: ignore[assignment]
        devnum: int = 2,
    ) -> Path:
        """A USB device on bus 1 at `port` ('1-1', '1-1.2') with its interfaces."""
        folder = self.controller / "usb1" / port
        files = {"idVendor": vendor, "idProduct": product, "busnum": "1", "devnum": str(devnum)}
        if serial is not None:
            files["serial"] = serial
        if model is not None:
            files["product"] = model
        if manufacturer is not None:
            files["manufacturer"] = manufacturer
        own = Node("usb", f"bus/usb/001/{devnum:03d}", USB_MAJOR, devnum - 1)
        self._files(folder, files)
        self._device(folder, "usb", {"DEVTYPE": "usb_device"})
        self._class_device(folder, own, in_place=True)
        nodes = [own]
        links = [port]
        for n, interface in enumerate(interfaces):
            name = f"{port}:1.{n}"
            self._files(
                folder / name,
                {"bInterfaceClass": interface.interface_class, "bInterfaceNumber": f"{n:02x}"},
            )
            self._device(folder / name, "usb", {"DEVTYPE": "usb_interface"})
            self._hid_count += any(n.subsystem == "hidraw" for n in interface.nodes)
            hid = f"0003:{int(vendor, 16):04X}:{int(product, 16):04X}.{self._hid_count:04X}"
            for node in interface.nodes:
                self._class_device(folder / name, node, hid=hid)
                nodes.append(node)
            links.append(name)
        for name in links[1:]:
            self._link(self.sys / "bus/usb/devices" / name, folder / name)
        self._link(self.sys / "bus/usb/devices" / port, folder)  # last: the device is whole
        self._make_nodes(port, nodes)
        return folder

    # -- PCI -------------------------------------------------------------------------

    def add_pci(
        self,
        address: str,
        vendor: str,
        device: str,
        *,
        pci_class: str = "0x120000",
        numa_node: int = -1,
        driver: str | None = None,
        iommu_group: int | None = None,
        bridge: str | None = None,
        nodes: list[Node] = (),  # type: ignore[assignment]
    ) -> Path:
        """A PCI device under root bus `pci<domain>:<bus>` and an optional `bridge`
        (a root port or switch port, itself a folder on the way down)."""
        top = bridge or address
        parent = self.sys / "devices" / f"pci{top[:7]}"  # the root bus: 'pci0000:3a'
        if bridge:
            parent = parent / bridge
            if not (parent / "class").exists():
                self._files(
                    parent,
                    {
                        "class": "0x060400",
                        "vendor": "0x8086",
                        "device": "0x2030",
                        "numa_node": str(numa_node),
                    },
                )
                self._device(parent, "pci", {"DRIVER": "pcieport", "PCI_SLOT_NAME": bridge})
        folder = parent / address
        files = {
            "vendor": _hex(vendor),
            "device": _hex(device),
            "class": pci_class,
            "numa_node": str(numa_node),
        }
        self._files(folder, files)
        uevent = {"PCI_CLASS": pci_class.removeprefix("0x").upper(), "PCI_SLOT_NAME": address}
        self._device(folder, "pci", {"DRIVER": driver, **uevent} if driver else uevent)
        if driver:
            drivers = self.sys / "bus/pci/drivers" / driver
            drivers.mkdir(parents=True, exist_ok=True)
            self._link(folder / "driver", drivers)
        made = list(nodes)
        if iommu_group is not None:
            group = self.sys / "kernel/iommu_groups" / str(iommu_group)
            (group / "devices").mkdir(parents=True, exist_ok=True)
            self._link(folder / "iommu_group", group)
            self._link(group / "devices" / address, folder)
        for node in nodes:
            self._class_device(folder, node)
        if driver == "vfio-pci" and iommu_group is not None:
            # The vfio container (a misc device) and the group's node: virtual devices.
            container = Node("misc", "vfio/vfio", VFIO_MAJOR, VFIO_MINOR)
            group_node = Node("vfio", f"vfio/{iommu_group}", VFIO_GROUP_MAJOR, iommu_group)
            virtual = self.sys / "devices" / "virtual"
            if not (virtual / "misc" / "vfio").exists():
                self._class_device(virtual / "misc" / "vfio", container, in_place=True)
            self._class_device(virtual / "vfio" / str(iommu_group), group_node, in_place=True)
            made += [container, group_node]
        self._link(self.sys / "bus/pci/devices" / address, folder)
        self._make_nodes(address, made)
        return folder

    # -- removal -----------------------------------------------------------------------

    def remove(self, name: str) -> None:
        """Unplug a device added by `add_usb`/`add_pci`: its bus links, folder, nodes."""
        bus = "pci" if name.count(":") == 2 else "usb"
        link = self.sys / "bus" / bus / "devices" / name
        folder = Path(os.path.realpath(link))
        for entry in sorted((self.sys / "bus" / bus / "devices").iterdir(), reverse=True):
            if entry.name == name or entry.name.startswith(name + ":"):
                entry.unlink()
        nodes = self._nodes.pop(name, [])
        gone = [folder]
        for node in nodes:
            if node.subsystem == "vfio":  # the group's virtual device goes with it
                gone.append(self.sys / "devices/virtual/vfio" / node.name)
        for links in (self.sys / "dev/char", *(self.sys / "class").iterdir()):
            for entry in links.iterdir():
                target = os.path.realpath(entry)
                if any(target == str(f) or target.startswith(f"{f}/") for f in gone):
                    entry.unlink()
        for each in gone:
            shutil.rmtree(each)
        for node in nodes:
            if node.devname == "vfio/vfio":
                continue  # shared by every vfio device
            (self.dev / node.devname).unlink(missing_ok=True)

    # -- helpers -----------------------------------------------------------------------

    def _files(self, folder: Path, files: dict[str, str]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (folder / name).write_text(text + "\n")

    def _device(self, folder: Path, bus: str, uevent: dict[str, str] | None = None) -> None:
        """A device's `subsystem` link and its `uevent` (no DEVNAME: no node of its own)."""
        folder.mkdir(parents=True, exist_ok=True)
        self._subsystem(folder, self.sys / "bus" / bus)
        (folder / "uevent").write_text("".join(f"{k}={v}\n" for k, v in (uevent or {}).items()))

    def _class_device(
        self, parent: Path, node: Node, *, in_place: bool = False, hid: str = ""
    ) -> None:
        """The class device that has `node`, with its `dev`, `uevent` and links, and
        the devices between it and `parent` (a usb-serial port, a HID device, a card)."""
        folder = parent if in_place else node.folder(parent, hid)
        if not in_place:
            for middle in reversed(folder.relative_to(parent).parents[:-1]):
                here = parent / middle
                if here.name == node.subsystem:  # the class's folder, not a device
                    continue
                kind, name = _MIDDLE[node.subsystem]
                if not (here / "uevent").exists():
                    here.mkdir(parents=True, exist_ok=True)
                    self._subsystem(here, self.sys / kind / name)
                    (here / "uevent").write_text("")
            folder.mkdir(parents=True, exist_ok=True)
            self._subsystem(folder, self.sys / "class" / node.subsystem)
            self._link(self.sys / "class" / node.subsystem / node.name, folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "dev").write_text(f"{node.major}:{node.minor}\n")
        with (folder / "uevent").open("a") as uevent:
            uevent.write(f"MAJOR={node.major}\nMINOR={node.minor}\nDEVNAME={node.devname}\n")
        self._link(self.sys / "dev/char" / f"{node.major}:{node.minor}", folder)

    def _make_nodes(self, owner: str, nodes: list[Node]) -> None:
        for node in nodes:
            path = self.dev / node.devname
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                make_node(path, node.major, node.minor)
        self._nodes[owner] = nodes

    def _subsystem(self, folder: Path, subsystem: Path) -> None:
        """`folder/subsystem`, a link to its bus or class folder (made if new)."""
        subsystem.mkdir(parents=True, exist_ok=True)
        self._link(folder / "subsystem", subsystem)

    @staticmethod
    def _link(link: Path, target: Path) -> None:
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink():
            link.unlink()
        link.symlink_to(os.path.relpath(target, link.parent))


def make_node(path: Path | str, major: int = 1, minor: int = 3) -> None:
    """A real character device node (by default the numbers of /dev/null)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(major, minor))


def _hex(text: str) -> str:
    return text if text.startswith("0x") else f"0x{text}"
