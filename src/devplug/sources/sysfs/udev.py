"""Hot-plug events from the kernel's uevent netlink socket (through pyudev), for a
mounted sysfs.

sysfs is a virtual file system that makes no inotify events when devices come and go,
so watching the real /sys needs the kernel's uevents; /dev (devtmpfs) does make them
and stays watched through inotify. The kernel's own events are used, not udevd's
re-broadcast: they need no udevd (absent in most containers) and come first; sysfs is
complete when they are sent, which is all a rescan needs. Uevents are sent in the
host's network namespace only, so the daemon's pod needs `hostNetwork: true`. pyudev
is imported only here, only when a config selects devices in a mounted sysfs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("devplug.sources.sysfs.udev")

_said: set[str] = set()  # each reason hot-plug falls back to /dev, said once per process


def _fall_back(reason: str) -> None:
    if reason not in _said:
        _said.add(reason)
        log.warning("%s: USB/PCI hot-plug is seen through /dev only", reason)


SUBSYSTEMS = ("usb", "pci", "tty", "video4linux", "hidraw", "sound", "drm", "vfio")


class UdevEvents:
    """Calls `callback` on every uevent of the subsystems devices are selected from."""

    def __init__(self, monitor: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._monitor = monitor
        self._loop = loop

    @classmethod
    def start(cls, callback: Callable[[], None]) -> UdevEvents | None:
        """Listen on the event loop; None (with a warning) where netlink is refused,
        leaving the inotify watch of /dev."""
        from devplug.ground.extras import MissingExtra, require

        try:
            pyudev = require("pyudev", "udev", "udev hot-plug events")
        except MissingExtra as e:
            _fall_back(str(e))
            return None
        try:
            monitor = pyudev.Monitor.from_netlink(pyudev.Context(), source="kernel")
            for subsystem in SUBSYSTEMS:
                monitor.filter_by(subsystem)
            monitor.start()
        except (OSError, pyudev.DeviceNotFoundError, ImportError) as e:
            _fall_back(f"udev events unavailable ({e})")
            return None
        loop = asyncio.get_running_loop()

        def readable() -> None:
            while monitor.poll(timeout=0) is not None:
                pass
            callback()

        loop.add_reader(monitor.fileno(), readable)
        return cls(monitor, loop)

    def close(self) -> None:
        self._loop.remove_reader(self._monitor.fileno())
