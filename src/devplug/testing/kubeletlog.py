"""The real kubelet's log: its klog lines (time, pid), one start of the kubelet, and
waits on what it logged (registrations, plugins dialled back), woken by inotify."""

from __future__ import annotations

import os
import re
import select
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# The kubelet's lines (v1.36, --v=2) for a registration request and for its end: the
# plugin dialled back, or not (`failed to dial device plugin: context deadline exceeded`).
REGISTRATION = "Got registration request from device plugin with resource"
CONNECTED = "Connected to new client"
DIAL_FAILED = "Failed to connect to new client"
_KLOG = re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6})\s+(\d+) ")


@dataclass(frozen=True)
class KubeletStart:
    """One start of the node's kubelet: its pid, when it started (wall clock, from the
    kernel's start time of the process) and where its lines begin in the log."""

    pid: int
    started: float
    log_offset: int


def process_start(pid: int) -> float:
    """The wall-clock time `pid` started (10 ms resolution: the kernel counts ticks
    since boot)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[19])  # field 22 of proc(5), counted after the command name
    since_boot = ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)


def klog_time(line: str) -> float | None:
    """The wall-clock time of a klog line (`I1201 10:16:00.123456  PID file:line] ...`),
    read in local time and this year, as klog writes it; None for other lines."""
    found = _KLOG.match(line)
    if found is None:
        return None
    month, day, hour, minute, second, micro = (int(g) for g in found.groups()[:6])
    year = time.localtime().tm_year
    stamp = time.mktime((year, month, day, hour, minute, second, 0, 0, -1))
    return stamp + micro / 1e6


def klog_pid(line: str) -> int | None:
    found = _KLOG.match(line)
    return int(found.group(7)) if found else None


class KubeletLog:
    """Reading the node's kubelet log at `kubelet_log`; RealNode is one."""

    @property
    def kubelet_log(self) -> Path:
        raise NotImplementedError

    def kubelet_lines(self, since: KubeletStart | int = 0) -> list[str]:
        """The kubelet's log lines from `since` (a start, or a byte offset); for a
        start, only the lines of that kubelet process."""
        offset = since.log_offset if isinstance(since, KubeletStart) else since
        with self.kubelet_log.open("rb") as log:
            log.seek(offset)
            lines = log.read().decode(errors="replace").splitlines()
        if isinstance(since, KubeletStart):
            lines = [line for line in lines if klog_pid(line) == since.pid]
        return lines

    def logged(
        self, message: str, key: str, since: KubeletStart | int = 0
    ) -> dict[str, list[float]]:
        """Value of `key` -> the times (wall clock) of the kubelet's lines with
        `message`, from `since`: e.g. `logged(REGISTRATION, "resourceName")`."""
        pattern = re.compile(rf'\b{re.escape(key)}="([^"]+)"')
        found: dict[str, list[float]] = defaultdict(list)
        for line in self.kubelet_lines(since):
            if message in line:
                value = pattern.search(line)
                stamp = klog_time(line)
                if value and stamp is not None:
                    found[value.group(1)].append(stamp)
        return dict(found)

    def registrations(self, since: KubeletStart | int = 0) -> dict[str, list[float]]:
        """Resource name -> the times the kubelet got a device-plugin registration
        request for it, from `since` (each request counts, refused or not)."""
        return self.logged(REGISTRATION, "resourceName", since)

    def connected(self, since: KubeletStart | int = 0) -> dict[str, list[float]]:
        """Resource name -> the times the kubelet dialled the plugin back and connected
        (the registration went through)."""
        return self.logged(CONNECTED, "resource", since)

    def all_connected(self, resources: list[str], since: KubeletStart | int) -> float | None:
        """When the kubelet had dialled back every one of `resources` since `since`
        (the last of them; wall clock), or None while one is missing."""
        connected = self.connected(since)
        if not all(connected.get(r) for r in resources):
            return None
        return max(min(connected[r]) for r in resources)

    def wait_connected(
        self, resources: list[str], since: KubeletStart | int, timeout: float = 30.0
    ) -> float:
        """Wait until the kubelet has dialled back every one of `resources` since
        `since`; when it did the last of them (wall clock, from its log)."""
        self.wait_kubelet_log(
            lambda _: self.all_connected(resources, since) is not None, since, timeout
        )
        done = self.all_connected(resources, since)
        assert done is not None
        return done

    def wait_kubelet_log(
        self,
        predicate: Callable[[list[str]], bool],
        since: KubeletStart | int = 0,
        timeout: float = 30.0,
    ) -> list[str]:
        """The kubelet's lines from `since` once `predicate` holds for them; woken by
        inotify on the log file, never polling. TimeoutError after `timeout` s."""
        from asyncinotify import Inotify, Mask

        deadline = time.monotonic() + timeout
        with Inotify() as inotify:
            inotify.add_watch(self.kubelet_log, Mask.MODIFY)
            while not predicate(lines := self.kubelet_lines(since)):
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([inotify.fd], [], [], left)[0]:
                    raise TimeoutError(f"the kubelet's log did not show it within {timeout:g} s")
                os.read(inotify.fd, 65536)  # drain; the lines are read again from the file
        return lines

    def log_offset(self) -> int:
        """Where the kubelet's log ends now: `kubelet_lines(offset)` reads what follows."""
        return self.kubelet_log.stat().st_size
