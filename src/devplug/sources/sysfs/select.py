"""Selecting sysfs devices by what they are (the `usb` and `pci` keys of a group), and
what each selected device becomes: ID, nodes, NUMA node, attributes.

The fields follow what operators know from the SR-IOV network device plugin's
selectors (vendors, devices, drivers, pciAddresses; any listed value matches, all
given fields must match).
"""

from __future__ import annotations

import posixpath
import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from devplug.config import hardware
from devplug.config.groups import GroupSpec
from devplug.config.ids import pci_resource_env
from devplug.framework.device import Attribute, Device, DeviceNode
from devplug.sources.sysfs.tree import VFIO_DRIVER, SysDevice, Sysfs

_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")


@dataclass(frozen=True, slots=True)
class Pool:
    """One model of a resource split by `split`: devices whose `key` is one of
    `values`."""

    key: str
    values: tuple[str, ...]
    model: str


@dataclass(frozen=True, slots=True)
class Selected:
    id: str
    sort_key: str
    nodes: tuple[DeviceNode, ...]
    attributes: Mapping[str, Attribute]
    numa_nodes: tuple[int, ...]
    sysfs: Path
    pci_path: tuple[str, ...]


def vfio_env(resource_name: str, devices: Iterable[Device]) -> dict[str, str]:
    """The PCI addresses of the allocated vfio-pci devices, comma-separated, for KubeVirt.
    Set per allocation rather than per device, so that a CDI spec (which sets a device's
    env, the last device's winning) never cuts the list to one address."""
    addresses = [
        str(d.attributes["pciAddress"])
        for d in devices
        if d.attributes.get("driver") == VFIO_DRIVER and "pciAddress" in d.attributes
    ]
    if not addresses:
        return {}
    return {pci_resource_env(resource_name): ",".join(dict.fromkeys(addresses))}


def device_id(device: SysDevice) -> str:
    """Stable and readable: the PCI address; a USB device's serial, else its port."""
    if device.kind == "pci":
        return device.name
    serial = str(device.attributes.get("serial", ""))
    safe = _ID_UNSAFE.sub("_", serial).strip("_")
    return f"usb-{safe}" if safe else f"usb-{device.name}"


def _same_hex(a: str, b: str) -> bool:
    try:
        return int(a, 16) == int(b, 16)
    except ValueError:
        return False


def _any_hex(wanted: hardware.Values | None, have: Attribute | None) -> bool:
    choices = hardware.values(wanted)
    return not choices or (have is not None and any(_same_hex(c, str(have)) for c in choices))


def usb_matches(usb: hardware.UsbSelector, device: SysDevice) -> list[str] | None:
    """The interfaces whose nodes the device brings, or None when it does not match."""
    a = device.attributes
    if not _any_hex(usb.vendor, a.get("vendorID")) or not _any_hex(usb.product, a.get("productID")):
        return None
    serials = hardware.values(usb.serial)
    if serials and a.get("serial") not in serials:
        return None
    classes = hardware.values(usb.interface_class)
    interfaces = [
        name
        for name, cls in device.interfaces.items()
        if not classes or any(_same_hex(c, cls) for c in classes)
    ]
    if classes and not interfaces:
        return None
    return interfaces


def pci_matches(pci: hardware.PciSelector, device: SysDevice) -> bool:
    a = device.attributes
    if not _any_hex(pci.vendor, a.get("vendorID")) or not _any_hex(pci.device, a.get("productID")):
        return False
    drivers = hardware.values(pci.driver)
    if drivers and a.get("driver") not in drivers:
        return False
    addresses = hardware.values(pci.address)
    if addresses and not any(
        device.name == (x if x.count(":") == 2 else f"0000:{x}").lower() for x in addresses
    ):
        return False
    classes = hardware.values(pci.class_)
    have = str(a.get("pciClass", "0x0"))
    return not classes or any(hardware.class_matches(have, c) for c in classes)


def selected_devices(sysfs: Sysfs, group: GroupSpec, pool: Pool | None) -> list[Selected]:
    """The devices `group` selects in sysfs now (of one model, with `pool`)."""
    found: list[Selected] = []
    if group.usb is not None:
        for device in sysfs.usb_devices():
            interfaces = usb_matches(group.usb, device)
            if interfaces is None:
                continue
            names = sysfs.devnames(device, interfaces)
            attributes = dict(device.attributes)
            if interfaces and group.usb.interface_class is not None:
                attributes["usbInterfaceClass"] = device.interfaces[interfaces[0]]
            found.append(_selected(sysfs, group, device, names, attributes))
    if group.pci is not None:
        for device in sysfs.pci_devices():
            if not pci_matches(group.pci, device):
                continue
            group_id = device.attributes.get("iommuGroup")
            if device.attributes.get("driver") == VFIO_DRIVER and group_id is not None:
                # KubeVirt's way: the vfio container and the device's IOMMU group (the
                # addresses go in PCI_RESOURCE_<RESOURCE> at Allocate: `vfio_env`).
                names = ["vfio/vfio", f"vfio/{group_id}"]
            else:
                names = sysfs.devnames(device)
            found.append(_selected(sysfs, group, device, names, device.attributes))
    if pool is not None:
        found = [
            replace(s, attributes={**s.attributes, "model": pool.model})
            for s in found
            if _in_pool(s.attributes.get(pool.key), pool)
        ]
    return found


def _in_pool(have: Attribute | None, pool: Pool) -> bool:
    if have is None:
        return False
    if pool.key in hardware.HEX_KEYS:
        return any(_same_hex(str(have), value) for value in pool.values)
    return str(have) in pool.values


def _selected(
    sysfs: Sysfs,
    group: GroupSpec,
    device: SysDevice,
    devnames: list[str],
    attributes: Mapping[str, Attribute],
) -> Selected:
    the_id = device_id(device)
    nodes: dict[str, DeviceNode] = {}
    for name in devnames:
        container = "/dev/" + name
        nodes.setdefault(container, DeviceNode(sysfs.dev_path(name), container))
    values = {"id": the_id, **{k: str(v) for k, v in attributes.items()}}
    for path in group.paths:
        container = fill(path.path, values)
        host = container
        if container.startswith("/dev/"):
            host = sysfs.dev_path(container.removeprefix("/dev/"))
        node = DeviceNode(host, path.container_path or container, path.permissions)
        nodes.setdefault(node.container_path, node)
    return Selected(
        the_id,
        device.name,
        tuple(nodes.values()),
        attributes,
        () if device.numa_node is None else (device.numa_node,),
        device.path,
        device.pci_path,
    )


def fill(template: str, values: Mapping[str, str]) -> str:
    """`template` with its {placeholders} replaced (an unknown one becomes '')."""
    out = []
    for literal, name, _, _ in string.Formatter().parse(template):
        out.append(literal)
        if name is not None:
            out.append(values.get(name, ""))
    return posixpath.normpath("".join(out)) if template.startswith("/") else "".join(out)
