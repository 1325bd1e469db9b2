"""The NVIDIA driver's numbering on a fake GPU host: the majors and minors of its device
nodes, the ranges of MIG GPU and compute instance IDs, and the MIG capability minors
(/proc/driver/nvidia-caps/mig-minors) made of them."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

MIG_GI_IDS = 15  # GPU instance IDs 0..14
MIG_CI_IDS = 8  # compute instance IDs 0..7 in a GPU instance
# The driver's device numbers. nvidia<minor> and nvidiactl (minor 255) are on the fixed
# major 195 (the CUDA installation guide's mknod lines); nvidia-uvm (minor 0, and 1 for
# nvidia-uvm-tools) and nvidia-caps (nvidia-cap<N>, N from mig-minors) get a major when
# their module loads. That one is read from /proc/devices where the driver is loaded;
# elsewhere a stand-in from the kernel's LOCAL/EXPERIMENTAL USE range 60-63
# (Documentation/admin-guide/devices.txt), never handed out dynamically.
NVIDIA_MAJOR = 195
CONTROL_MINOR = 255
STAND_IN_MAJORS = {"nvidia-uvm": 60, "nvidia-caps": 61}
PROC_DEVICES = "/proc/devices"


def device_node(path: Path, major: int, minor: int, mode: int) -> None:
    """A character device node `path`; where mknod is not allowed (not root, or no
    CAP_MKNOD), an empty file of that mode stands in: a fake host's nodes are found
    and passed on, never opened, so `devplug plan` and `fleet` run as any user."""
    try:
        os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
    except PermissionError:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode))
    os.chmod(path, mode)  # past the umask


def driver_major(name: str, proc_devices: str = PROC_DEVICES) -> int:
    """The character major the kernel gave the driver `name`, else its stand-in."""
    with contextlib.suppress(OSError), open(proc_devices) as f:
        for line in f:
            if line.startswith("Block"):
                break
            number, _, driver = line.strip().partition(" ")
            if driver == name and number.isdigit():
                return int(number)
    return STAND_IN_MAJORS[name]


def mig_minors(entries: Iterable[dict[str, Any]]) -> list[str]:
    """/proc/driver/nvidia-caps/mig-minors as the driver lays it out: config, monitor,
    then per GPU per GPU instance ID its access minor and those of its compute instances."""
    lines = ["config 1", "monitor 2"]
    minor = 3
    for entry in entries:
        for gi in range(MIG_GI_IDS):
            lines.append(f"gpu{entry['minor']}/gi{gi}/access {minor}")
            minor += 1
            for ci in range(MIG_CI_IDS):
                lines.append(f"gpu{entry['minor']}/gi{gi}/ci{ci}/access {minor}")
                minor += 1
    return lines
