"""Host device nodes from the config: discovery by path, glob and sysfs selector,
health by existence and optional checks.

A group of paths is one device, or one device per match of each glob in it; a group
with a `usb` or `pci` selector is one device per matching device in sysfs, with the
nodes sysfs names. Every device seen stays in the list for the life of the process:
Healthy while it is present with all its host paths (and its health checks pass),
Unhealthy otherwise. The folders that hold the paths, and the sysfs bus folders, are
watched through inotify (udev netlink on the real /sys, whose entries make no inotify
events), so a removed or new device is published within milliseconds and an idle
plugin costs nothing.
"""

from __future__ import annotations

import asyncio
import glob
import logging
import os
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from devplug.config import hardware
from devplug.config.groups import GroupSpec, group_device_id, has_glob, is_selector, required_mounts
from devplug.config.ids import ids_env_name, path_device_id, replica_ids
from devplug.config.resource import ResourceSpec
from devplug.framework.cdi import apply_mode
from devplug.framework.device import Attribute, ContainerEdits, Device, DeviceNode, Mount
from devplug.framework.preferred import pick
from devplug.ground.dirwatch import DirWatcher
from devplug.kube.cdi import default_kind
from devplug.outputs.nfd import device_labels
from devplug.sources.health import run_checks, verdicts
from devplug.sources.hostwatch import FolderWatch, folders
from devplug.sources.protocol import SourcePlugin
from devplug.sources.sysfs.select import Pool, Selected, selected_devices, vfio_env
from devplug.sources.sysfs.tree import Sysfs

log = logging.getLogger("devplug.sources.hostdev")


# The middle part of `_Base.order` for a device picked by a sysfs selector (a path
# gives its glob index, or -1 for a plain path).
_SELECTED = -2


@dataclass(frozen=True, slots=True)
class _Base:
    """One device before replication: its full ID, place in the list and host nodes."""

    id: str
    order: tuple[int, int, str]  # group, glob path (-1: none; _SELECTED), matched path
    nodes: tuple[DeviceNode, ...]
    group: GroupSpec
    # From sysfs, for selected devices: what it is, its NUMA node, sysfs folder and PCI
    # path (the bridges above it, for the 'pci' policy).
    attributes: Mapping[str, Attribute] = field(default_factory=dict)
    numa_nodes: tuple[int, ...] = ()
    sysfs: Path | None = None
    pci_path: tuple[str, ...] = ()

    @property
    def selected(self) -> bool:
        """Picked by a sysfs selector (it may leave sysfs), rather than named by a path."""
        return self.order[1] == _SELECTED


def no_node_warning(resource: str, g: int, device_id: str, selected: Selected) -> str:
    """A selected device whose node is not under it in sysfs (virtio-rng's /dev/hwrng,
    a network card) reaches containers with its env and mounts only: say so, and how
    to give it one."""
    a = selected.attributes
    what = ":".join(str(a[k]).removeprefix("0x") for k in ("vendorID", "productID") if k in a)
    return (
        f"{resource}: device {device_id}{f' ({what})' if what else ''} has no device node "
        f"under it in sysfs: containers get none from it; to give them one, name it by "
        f"path in groups[{g}].paths"
    )


class HostDevicePlugin(SourcePlugin):
    """Serves the device nodes of one configured resource (`groups`); `pool` keeps only
    the devices of one model of a resource split by `split`."""

    def __init__(
        self, spec: ResourceSpec, sysfs: Sysfs | None = None, pool: Pool | None = None
    ) -> None:
        if spec.groups is None:
            raise ValueError(f"{spec.name}: a host device resource needs 'groups'")
        super().__init__(spec.name)
        self.spec = spec
        self.groups = spec.groups
        self.sysfs = sysfs or Sysfs()
        self.pool = pool
        self.ids_env = ids_env_name(spec.name)
        self.preferred_allocation = spec.preferred_allocation
        self.cdi_mode = hardware.mode_of(spec.cdi)
        self.cdi_kind = (spec.cdi.kind if spec.cdi else None) or default_kind(spec.name)
        self.uses_sysfs = any(is_selector(g) for g in self.groups)
        self._present: set[str] = set()  # selected devices in sysfs now
        # Health-check verdicts by base ID; with checks, a device without one (new, or
        # back after going away) is Unhealthy until checked.
        self._checks_ok: dict[str, bool] = {}
        self._there: set[str] = set()  # checked devices there (nodes too) at the last look
        # Globs that match nothing now and paths that clash on an ID, as one-line
        # messages; refreshed by discover().
        self._warnings: list[str] = []
        self._known: dict[str, _Base] = {}  # every device seen, by full ID
        self._health: dict[str, bool] = {}  # full ID of each device seen -> healthy

    @property
    def warnings(self) -> list[str]:
        return self._warnings

    # -- discovery ----------------------------------------------------------------

    def discover(self) -> list[Device]:
        """Look at the host now and return the devices to serve (replicas included).

        New glob matches join the devices seen before; none is ever dropped.
        """
        warnings: list[str] = []
        self._present = set()
        for g, group in enumerate(self.groups):
            if is_selector(group):
                self._discover_selected(g, group, warnings)
            else:
                self._discover_paths(g, group, warnings)
        self._warnings = warnings
        devices: list[Device] = []
        self._health = {}
        for base in self.bases():
            reason = ""
            if not _nodes_exist(base):
                reason = "device node missing"
            elif base.selected and base.id not in self._present:
                reason = "device gone"
            elif not self._checks_ok.get(base.id, self.spec.health is None):
                reason = "health check failed"
            healthy = not reason
            self._health[base.id] = healthy
            group = base.group
            mounts = tuple(
                Mount(m.host_path, m.container_path, m.read_only)
                for m in group.mounts
                if not m.optional or os.path.exists(m.host_path)
            )
            numa = base.numa_nodes if group.numa_node is None else (group.numa_node,)
            for device_id in replica_ids(base.id, group.count or self.spec.count):
                devices.append(
                    Device(
                        device_id,
                        healthy,
                        numa_nodes=numa,
                        nodes=base.nodes,
                        mounts=mounts,
                        env=group.env,
                        annotations=group.annotations,
                        cdi_devices=tuple(group.cdi_devices),
                        attributes={**base.attributes, **group.attributes},
                        health_reason=reason,
                    )
                )
        return devices

    def _discover_selected(self, g: int, group: GroupSpec, warnings: list[str]) -> None:
        """The devices a sysfs selector picks now (`self._present` records them)."""
        for selected in selected_devices(self.sysfs, group, self.pool):
            device_id = selected.id
            if device_id in self._present:
                # Two devices with one serial: the second is known by its port.
                device_id = f"usb-{selected.sort_key}"
                warnings.append(
                    f"{self.resource_name}: {selected.sort_key} has the serial of "
                    f"device {selected.id!r}: it is served as {device_id!r}"
                )
            base = _Base(
                device_id,
                (g, _SELECTED, selected.sort_key),
                selected.nodes,
                group,
                selected.attributes,
                selected.numa_nodes,
                selected.sysfs,
                selected.pci_path,
            )
            self._present.add(base.id)
            if warning := self._add(base, replace=True):
                warnings.append(warning)
            if not base.nodes:
                warnings.append(no_node_warning(self.resource_name, g, device_id, selected))

    def _discover_paths(self, g: int, group: GroupSpec, warnings: list[str]) -> None:
        """The devices of a group of paths: one for the static paths, one per glob match."""
        # An optional path missing now is left out; the device is seen again with it
        # when it comes (`replace`: the nodes of now, not those first seen).
        static = tuple(
            _node(p.path, p.container_path, p.permissions)
            for p in group.paths
            if not has_glob(p.path) and not (p.optional and not os.path.lexists(p.path))
        )
        replace = any(p.optional for p in group.paths)
        globs = [(k, p) for k, p in enumerate(group.paths) if has_glob(p.path)]
        if not globs:
            base = _Base(group_device_id(group), (g, -1, ""), static, group)
            if warning := self._add(base, replace):
                warnings.append(warning)
            return
        for k, spec in globs:
            matches = sorted(glob.glob(spec.path))
            if not matches and not spec.optional:
                where = f"groups[{g}].paths[{k}].path"
                warnings.append(f"{self.resource_name}: {where}: {spec.path!r} matches nothing")
            for match in matches:
                node = _node(match, spec.container_path, spec.permissions)
                base = _Base(path_device_id(match), (g, k, match), (node, *static), group)
                if warning := self._add(base, replace):
                    warnings.append(warning)

    def bases(self) -> list[_Base]:
        """Every device seen (before replication), in list order."""
        return sorted(self._known.values(), key=lambda b: b.order)

    def present_bases(self) -> list[_Base]:
        """The devices seen that are there now (a selected device gone from sysfs is
        not: it is Unhealthy already, and its checks would only fail)."""
        return [b for b in self.bases() if not b.selected or b.id in self._present]

    def _add(self, base: _Base, replace: bool = False) -> str | None:
        """Remember `base` (`replace`: its latest sysfs view); a warning if its ID is
        already another path's."""
        known = self._known.setdefault(base.id, base)
        same = known.order[:2] == base.order[:2] if base.selected else known.order == base.order
        if same:
            if replace:
                # The same device seen again, maybe on another port or with other nodes.
                self._known[base.id] = base
            return None
        # Two paths give one ID (e.g. '/dev/a-b' and '/dev/a/b'): the first seen wins.
        return (
            f"{self.resource_name}: {_first_path(base)} gives device ID {base.id!r}, "
            f"already the ID of {_first_path(known)}: it is not served"
        )

    # -- watching -------------------------------------------------------------------

    def folders(self) -> dict[Path, set[str]]:
        """The folders to watch now, each with the name patterns relevant in it."""
        selected = [n for b in self._known.values() if b.selected for n in b.nodes]
        return folders(self.groups, self.sysfs if self.uses_sysfs else None, selected)

    def _publish_now(self) -> None:
        old_warnings, old_health = set(self.warnings), self._health
        devices = self.discover()
        for warning in self.warnings:
            if warning not in old_warnings:
                log.warning("%s", warning)
        for base_id, healthy in self._health.items():
            before = old_health.get(base_id)
            if before == healthy:
                continue
            state = "healthy" if healthy else "unhealthy"
            paths = ", ".join(n.host_path for n in self._known[base_id].nodes)
            if before is None:
                log.info("%s: device %s (%s), %s", self.resource_name, base_id, paths, state)
            else:
                log.debug("%s: device %s is now %s (%s)", self.resource_name, base_id, state, paths)
        self.publish(devices)

    async def scan(self) -> None:
        dirty = asyncio.Event()

        def on_event(folder: Path, name: str) -> None:
            if watch.relevant(folder, name):
                dirty.set()

        watcher = DirWatcher(on_event)
        watch = FolderWatch(self.resource_name, watcher)
        events = asyncio.create_task(watcher.run(), name=f"watch {self.resource_name}")
        events.add_done_callback(lambda _: dirty.set())
        helpers: list[asyncio.Task[None]] = []
        udev = None
        if self.uses_sysfs and self.sysfs.is_real:
            from devplug.sources.sysfs.udev import UdevEvents  # pyudev: only for real /sys

            udev = UdevEvents.start(dirty.set)
        try:
            # Watch first, then look: a change after the look is an event.
            if not watch.rewatch(self.folders()):
                dirty.set()
            if self.spec.health is not None:
                interval = self.spec.health.interval
                helpers.append(asyncio.create_task(run_checks(self._check, interval, dirty.set)))
                helpers[-1].add_done_callback(lambda _: dirty.set())
            await self._look()
            while True:
                await dirty.wait()
                if events.done():
                    events.result()
                    raise RuntimeError(f"{self.resource_name}: the folder watcher stopped")
                for helper in helpers:
                    if helper.done():
                        helper.result()
                        raise RuntimeError(f"{self.resource_name}: the health checks stopped")
                dirty.clear()
                before = watcher.folders
                if not watch.rewatch(self.folders()):
                    dirty.set()
                await self._look()
                if watch.rewatch(self.folders()) and watcher.folders != before:
                    dirty.set()  # folders of new nodes: look once more, now watched
        finally:
            events.cancel()
            for helper in helpers:
                helper.cancel()
            await asyncio.gather(events, *helpers, return_exceptions=True)
            watcher.close()
            if udev is not None:
                udev.close()

    async def _look(self) -> None:
        """Publish the devices now. With health checks, a device that has just come (or
        come back) is checked first: no pod gets a device that fails its checks."""
        if self.spec.health is not None:
            self.discover()
            present = [b for b in self.present_bases() if _nodes_exist(b)]
            new = [b for b in present if b.id not in self._there]
            now = {b.id for b in present}
            for gone in self._there - now:
                self._checks_ok.pop(gone, None)
            self._there = now
            if new:
                await self._check(new)
        self._publish_now()

    async def checked_devices(self) -> list[Device]:
        """The devices now, with their health checks run once (what `devplug check`
        shows: without a verdict, a device with checks would read Unhealthy)."""
        self.discover()
        if self.spec.health is not None:
            await self._check()
        return self.discover()

    async def _check(self, bases: Sequence[_Base] | None = None) -> bool:
        """Run the health checks of `bases` (default: every device there) once and
        record the verdicts; True when one changed."""
        assert self.spec.health is not None
        found = await verdicts(self.present_bases() if bases is None else bases, self.spec.health)
        changed = any(self._checks_ok.get(k) != v for k, v in found.items())
        self._checks_ok.update(found)
        return changed

    # -- hooks ----------------------------------------------------------------------

    async def allocate(self, devices: Sequence[Device]) -> ContainerEdits:
        edits = await super().allocate(devices)
        if self.uses_sysfs:
            edits.env.update(vfio_env(self.resource_name, devices))
        return apply_mode(edits, devices, self.cdi_kind, self.cdi_mode)

    async def preferred(
        self, available: Sequence[Device], must_include: Sequence[Device], size: int
    ) -> Sequence[str]:
        paths = (
            {b.id: b.pci_path for b in self._known.values()} if self.spec.preferred == "pci" else {}
        )
        return pick(self.spec.preferred, available, must_include, size, paths)

    def node_labels(self) -> Mapping[str, str]:
        return device_labels(self.resource_name, self.devices.values())


def _first_path(base: _Base) -> str:
    if base.nodes:
        return base.nodes[0].host_path
    return base.group.paths[0].path if base.group.paths else base.id


def _nodes_exist(base: _Base) -> bool:
    """Its nodes, and the mounts it requires, are there (a group of paths, each optional
    and missing, has none: nothing to serve)."""
    mounts = required_mounts(base.group)
    if not base.nodes and not base.selected and not mounts:
        return False
    return all(os.path.exists(path) for path in (*(n.host_path for n in base.nodes), *mounts))


def _node(host_path: str, container_path: str, permissions: str) -> DeviceNode:
    """A node; a container path ending in '/' is a folder where it keeps its name."""
    if container_path.endswith("/"):
        container_path += posixpath.basename(host_path)
    return DeviceNode(host_path, container_path or host_path, permissions)
