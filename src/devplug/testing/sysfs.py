"""Fake sysfs and /dev trees laid out like the kernel's, for tests and benchmarks.

Device folders live under `sys/devices/...`; `sys/bus/{usb,pci}/devices/<name>`,
`driver`, `iommu_group` and `sys/dev/char/M:m` are real relative symlinks into them;
class devices (`tty/ttyUSB0`, `drm/card0`...) carry `dev` and `uevent` files that name
their node; the nodes are real character devices made with mknod (root needed). A
device is added the kernel's way round (folders, then its bus link, then its nodes)
and removed the other way round, so a watcher sees a complete device or none.

    tree = FakeSysfs(tmp_path)
    tree.add_usb("1-1", "0403", "6010", serial="FT1", interfaces=[
        UsbInterface("ff", [Node("tty", "ttyUSB0", 188, 0)]),
        UsbInterface("ff", [Node("tty", "ttyUSB1", 188, 1)])])
    tree.add_pci("0000:3b:00.0", "10ee", "500c", numa_node=0, driver="xclmgmt")
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

USB_CONTROLLER = "0000:00:14.0"
VFIO_MAJOR = 10
VFIO_MINOR = 196
VFIO_GROUP_MAJOR = 243
USB_MAJOR = 189


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


@dataclass(frozen=True)
class UsbInterface:
    interface_class: str  # hex, e.g. 'ff', '0e', '08'
    nodes: list[Node] = field(default_factory=list)


class FakeSysfs:
    def __init__(self, base: Path | str, *, usb_numa_node: int = 0) -> None:
        self.base = Path(base)
        self.sys = self.base / "sys"
        self.dev = self.base / "dev"
        for folder in ("bus/usb/devices", "bus/pci/devices", "bus/pci/drivers", "dev/char"):
            (self.sys / folder).mkdir(parents=True, exist_ok=True)
        (self.sys / "kernel" / "iommu_groups").mkdir(parents=True, exist_ok=True)
        self.dev.mkdir(parents=True, exist_ok=True)
        self._nodes: dict[str, list[Node]] = {}
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
        (self.controller / "usb1").mkdir(exist_ok=True)
        self._link(self.sys / "bus/usb/devices/usb1", self.controller / "usb1")

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
        self._class_device(folder, own, in_place=True)
        nodes = [own]
        links = [port]
        for n, interface in enumerate(interfaces):
            name = f"{port}:1.{n}"
            self._files(
                folder / name,
                {"bInterfaceClass": interface.interface_class, "bInterfaceNumber": f"{n:02x}"},
            )
            for node in interface.nodes:
                self._class_device(folder / name, node)
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
        domain_bus = address[:7]
        parent = self.sys / "devices" / f"pci{domain_bus[:4]}:{'00'}"
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
        folder = parent / address
        files = {
            "vendor": _hex(vendor),
            "device": _hex(device),
            "class": pci_class,
            "numa_node": str(numa_node),
        }
        self._files(folder, files)
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
            self._class_device(folder / node.subsystem, node)
        if driver == "vfio-pci" and iommu_group is not None:
            made += [
                Node("vfio", "vfio/vfio", VFIO_MAJOR, VFIO_MINOR),
                Node("vfio", f"vfio/{iommu_group}", VFIO_GROUP_MAJOR, iommu_group),
            ]
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
        for entry in (self.sys / "dev/char").iterdir():
            target = os.path.realpath(entry)
            if target == str(folder) or target.startswith(str(folder) + "/"):
                entry.unlink()
        shutil.rmtree(folder)
        for node in self._nodes.pop(name, []):
            if node.devname == "vfio/vfio":
                continue  # shared by every vfio device
            (self.dev / node.devname).unlink(missing_ok=True)

    # -- helpers -----------------------------------------------------------------------

    def _files(self, folder: Path, files: dict[str, str]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (folder / name).write_text(text + "\n")

    def _class_device(self, parent: Path, node: Node, in_place: bool = False) -> None:
        folder = parent if in_place else parent / node.subsystem / node.name
        if node.subsystem == "drm":
            folder = parent / node.name  # drm/card0, not drm/drm/card0
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "dev").write_text(f"{node.major}:{node.minor}\n")
        (folder / "uevent").write_text(
            f"MAJOR={node.major}\nMINOR={node.minor}\nDEVNAME={node.devname}\n"
        )
        self._link(self.sys / "dev/char" / f"{node.major}:{node.minor}", folder)

    def _make_nodes(self, owner: str, nodes: list[Node]) -> None:
        for node in nodes:
            path = self.dev / node.devname
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                make_node(path, node.major, node.minor)
        self._nodes[owner] = nodes

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
