"""Helpers for the real-hardware tests: fake trees, configs, waiting on files."""

from __future__ import annotations

import asyncio
import json
import os
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema

from devplug.fakes.sysfs import FakeSysfs, Node, UsbInterface

SCHEMA = json.loads((Path(__file__).parent / "cdi_schema.json").read_text())
TIMEOUT_S = 10.0


def validate_cdi(document: dict[str, Any]) -> None:
    jsonschema.validate(document, SCHEMA)


def read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


async def wait_for_file(path: Path, condition: Callable[[str | None], bool]) -> str | None:
    """Wait, on inotify events of the file's folder, until `condition(content)` holds
    (content None: no file); the content then."""
    from asyncinotify import Inotify, Mask

    path.parent.mkdir(parents=True, exist_ok=True)
    with Inotify() as inotify:
        inotify.add_watch(path.parent, Mask.CREATE | Mask.MOVED_TO | Mask.DELETE | Mask.CLOSE_WRITE)
        content = read(path)
        if condition(content):
            return content
        async with asyncio.timeout(TIMEOUT_S):
            async for _ in inotify:
                content = read(path)
                if condition(content):
                    return content
    raise AssertionError("unreachable")


def wait_file(path: Path, condition: Callable[[str | None], bool]) -> str | None:
    """`wait_for_file` for a test with no loop of its own (one that drives a daemon
    process from sync code): the wait gets a loop of its own."""
    return asyncio.run(wait_for_file(path, condition))


def standard_tree(base: Path) -> FakeSysfs:
    """The issue's hardware: a USB serial adapter with two interfaces, a webcam, a USB
    stick; two PCI FPGAs of one vendor with different device IDs on two NUMA nodes,
    one bound to vfio-pci."""
    tree = FakeSysfs(base)
    tree.add_usb(
        "1-1",
        "0403",
        "6010",
        serial="FT4ABC",
        model="Dual RS232-HS",
        manufacturer="FTDI",
        interfaces=[
            UsbInterface("ff", [Node("tty", "ttyUSB0", 188, 0)]),
            UsbInterface("ff", [Node("tty", "ttyUSB1", 188, 1)]),
        ],
        devnum=2,
    )
    tree.add_usb(
        "1-2",
        "046d",
        "0825",
        serial="WC1",
        model="Webcam C270",
        manufacturer="Logitech",
        interfaces=[
            UsbInterface("0e", [Node("video4linux", "video0", 81, 0)]),
            UsbInterface("0e", [Node("video4linux", "video1", 81, 1)]),
            UsbInterface("01", [Node("sound", "snd/controlC1", 116, 10)]),
        ],
        devnum=3,
    )
    tree.add_usb(
        "1-3",
        "0781",
        "5567",
        serial="STICK1",
        model="Cruzer Blade",
        interfaces=[UsbInterface("08")],
        devnum=4,
    )
    add_u250(tree)
    tree.add_pci(
        "0000:d8:00.0",
        "10ee",
        "500d",
        numa_node=1,
        driver="vfio-pci",
        iommu_group=40,
        bridge="0000:d7:00.0",
    )
    return tree


def add_u250(tree: FakeSysfs) -> None:
    """The FPGA at 0000:3b:00.0 on NUMA node 0, with its driver and DRM nodes."""
    tree.add_pci(
        "0000:3b:00.0",
        "10ee",
        "500c",
        numa_node=0,
        driver="xclmgmt",
        iommu_group=12,
        bridge="0000:3a:00.0",
        nodes=[Node("drm", "dri/card1", 226, 1), Node("drm", "dri/renderD128", 226, 128)],
    )


def roots(tree: FakeSysfs) -> str:
    return f"sysfsRoot: {tree.sys}\ndevRoot: {tree.dev}\n"


def exists(path: Path) -> bool:
    return os.path.lexists(path)


SERIAL = "example.com/serial"
WEBCAM = "example.com/webcam"


def hardware_config(tree: FakeSysfs, extra: str = "") -> str:
    return (
        roots(tree)
        + textwrap.dedent(
            f"""\
        resources:
          - name: {SERIAL}
            groups:
              - usb: {{vendor: "0403", product: ["6010", "6011"]}}
          - name: {WEBCAM}
            groups:
              - usb: {{interfaceClass: "0x0e"}}
          - name: example.com/fpga
            groups:
              - pci: {{vendor: "10ee", class: "0x1200/0xff00"}}
            split: {{by: productID, models: {{"0x500c": u250, "0x500d": u280}}}}
        """
        )
        + extra
    )
