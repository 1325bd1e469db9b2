"""Hot-plug latency on fake sysfs trees: a USB or PCI device appearing in sysfs until
ListAndWatch lists it Healthy, and its removal until ListAndWatch says Unhealthy,
against a real `devplug serve` (inotify on the fake trees)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from common import daemon, percentiles, stub_for, wait_for_health

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.fakes.sysfs import FakeSysfs, Node, UsbInterface

ROUNDS = 10


def bench_sysfs(root: Path) -> dict[str, Any]:
    tree = FakeSysfs(root / "hw")
    config = root / "sysfs.yaml"
    config.write_text(
        f"sysfsRoot: {tree.sys}\ndevRoot: {tree.dev}\nresources:\n"
        "  - {name: bench.devplug.io/usb, groups: [{usb: {vendor: '0403'}}]}\n"
        "  - {name: bench.devplug.io/pci, groups: [{pci: {vendor: '10ee'}}]}\n"
    )
    plugin_dir = root / "sysfs-plugins"

    def add_usb() -> None:
        tree.add_usb(
            "1-1",
            "0403",
            "6001",
            serial="BENCH",
            interfaces=[UsbInterface("ff", [Node("tty", "ttyUSB0", 188, 0)])],
        )

    def add_pci() -> None:
        tree.add_pci("0000:3b:00.0", "10ee", "500c", numa_node=0, driver="xclmgmt")

    results: dict[str, Any] = {}
    with daemon(config, plugin_dir):
        for kind, add, name, device in (
            ("usb", add_usb, "1-1", "usb-BENCH"),
            ("pci", add_pci, "0000:3b:00.0", "0000:3b:00.0"),
        ):
            channel, stub = stub_for(plugin_dir, f"bench.devplug.io/{kind}")
            appear, gone = [], []
            with channel:
                stream = stub.ListAndWatch(pb.Empty())
                next(stream)  # the first list, empty
                for _ in range(ROUNDS):
                    started = time.perf_counter()
                    add()
                    wait_for_health(stream, device, "Healthy")
                    appear.append(time.perf_counter() - started)
                    started = time.perf_counter()
                    tree.remove(name)
                    wait_for_health(stream, device, "Unhealthy")
                    gone.append(time.perf_counter() - started)
                stream.cancel()
            results[kind] = {
                "appeared_to_listed": percentiles(appear),
                "removed_to_unhealthy": percentiles(gone),
            }
    return results
