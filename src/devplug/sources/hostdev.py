"""Host device nodes from the config: discovery by path and glob, health by existence.

A group of paths is one device, or one device per match of each glob in it. Every
device seen stays in the list for the life of the process: Healthy while all its host
paths exist, Unhealthy while one is missing. The folders that hold the paths are
watched through inotify, so a removed or new node is published within milliseconds
and an idle plugin costs nothing.
"""

from __future__ import annotations

import asyncio
import glob
import logging
import os
import posixpath
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from devplug.framework.device import Device, DeviceNode, Mount
from devplug.framework.dirwatch import DirWatcher
from devplug.framework.plugin import Plugin
from devplug.sources.config import (
    GroupSpec,
    ResourceSpec,
    group_device_id,
    has_glob,
    ids_env_name,
    path_device_id,
    replica_ids,
)

log = logging.getLogger("devplug.sources.hostdev")


@dataclass(frozen=True, slots=True)
class _Base:
    """One device before replication: its full ID, place in the list and host nodes."""

    id: str
    order: tuple[int, int, str]  # group, glob path (-1: none), matched path
    nodes: tuple[DeviceNode, ...]
    group: GroupSpec


class HostDevicePlugin(Plugin):
    """Serves the device nodes of one configured resource (`groups`)."""

    def __init__(self, spec: ResourceSpec) -> None:
        if spec.groups is None:
            raise ValueError(f"{spec.name}: a host device resource needs 'groups'")
        super().__init__(spec.name)
        self.spec = spec
        self.groups = spec.groups
        self.ids_env = ids_env_name(spec.name)
        self.preferred_allocation = spec.preferred_allocation
        # Globs that match nothing now and paths that clash on an ID, as one-line
        # messages; refreshed by discover().
        self.warnings: list[str] = []
        self._known: dict[str, _Base] = {}  # every device seen, by full ID
        self._health: dict[str, bool] = {}  # full ID of each device seen -> healthy
        self._interest: dict[Path, set[str]] = {}  # watched folder -> name patterns
        self._unwatchable: set[Path] = set()

    # -- discovery ----------------------------------------------------------------

    def discover(self) -> list[Device]:
        """Look at the host now and return the devices to serve (replicas included).

        New glob matches join the devices seen before; none is ever dropped.
        """
        warnings: list[str] = []
        for g, group in enumerate(self.groups):
            static = tuple(
                _node(p.path, p.container_path, p.permissions)
                for p in group.paths
                if not has_glob(p.path)
            )
            globs = [(k, p) for k, p in enumerate(group.paths) if has_glob(p.path)]
            if not globs:
                base = _Base(group_device_id(group), (g, -1, ""), static, group)
                if warning := self._add(base):
                    warnings.append(warning)
                continue
            for k, spec in globs:
                matches = sorted(glob.glob(spec.path))
                if not matches:
                    where = f"groups[{g}].paths[{k}].path"
                    warnings.append(f"{self.resource_name}: {where}: {spec.path!r} matches nothing")
                for match in matches:
                    node = _node(match, "", spec.permissions)
                    base = _Base(path_device_id(match), (g, k, match), (node, *static), group)
                    if warning := self._add(base):
                        warnings.append(warning)
        self.warnings = warnings
        devices: list[Device] = []
        self._health = {}
        for base in sorted(self._known.values(), key=lambda b: b.order):
            healthy = all(os.path.exists(n.host_path) for n in base.nodes)
            self._health[base.id] = healthy
            group = base.group
            mounts = tuple(Mount(m.host_path, m.container_path, m.read_only) for m in group.mounts)
            for device_id in replica_ids(base.id, self.spec.count):
                devices.append(
                    Device(
                        device_id,
                        healthy,
                        numa_nodes=() if group.numa_node is None else (group.numa_node,),
                        nodes=base.nodes,
                        mounts=mounts,
                        env=group.env,
                        annotations=group.annotations,
                        cdi_devices=tuple(group.cdi_devices),
                        attributes=group.attributes,
                    )
                )
        return devices

    def _add(self, base: _Base) -> str | None:
        """Remember `base`; a warning if its ID is already another path's."""
        known = self._known.setdefault(base.id, base)
        if known.order == base.order:
            return None
        # Two paths give one ID (e.g. '/dev/a-b' and '/dev/a/b'): the first seen wins.
        return (
            f"{self.resource_name}: {base.nodes[0].host_path} gives device ID {base.id!r}, "
            f"already the ID of {known.nodes[0].host_path}: it is not served"
        )

    # -- watching -------------------------------------------------------------------

    def folders(self) -> dict[Path, set[str]]:
        """The folders to watch now, each with the name patterns relevant in it: the
        folder of each path (or its nearest existing ancestor), and for a glob the
        folders that match its components up to the last."""
        interest: dict[Path, set[str]] = {}
        for group in self.groups:
            for spec in group.paths:
                for folder, pattern in _folders_of(spec.path):
                    interest.setdefault(Path(folder), set()).add(pattern)
        return interest

    def _relevant(self, folder: Path, name: str) -> bool:
        if not name:  # a watched folder itself went away
            return True
        return any(fnmatchcase(name, p) for p in self._interest.get(folder, ()))

    def _rewatch(self, watcher: DirWatcher) -> bool:
        """Watch the folders of now; False if one vanished before it could be watched
        (look again: its parent is watched instead)."""
        self._interest = self.folders()
        watcher.set_folders(set(self._interest))
        missing = set(self._interest) - watcher.folders
        vanished = {f for f in missing if not f.is_dir()}
        # Present but refused (e.g. the inotify watch limit): say so once, and do not
        # retry in a loop; the next event elsewhere tries again.
        for folder in sorted(missing - vanished - self._unwatchable):
            log.warning("%s: cannot watch %s: changes in it are missed", self.resource_name, folder)
        self._unwatchable = missing - vanished
        return not vanished

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
                log.info("%s: device %s is now %s (%s)", self.resource_name, base_id, state, paths)
        self.publish(devices)

    async def scan(self) -> None:
        dirty = asyncio.Event()

        def on_event(folder: Path, name: str) -> None:
            if self._relevant(folder, name):
                dirty.set()

        watcher = DirWatcher(on_event)
        events = asyncio.create_task(watcher.run(), name=f"watch {self.resource_name}")
        events.add_done_callback(lambda _: dirty.set())
        try:
            # Watch first, then look: a change after the look is an event.
            if not self._rewatch(watcher):
                dirty.set()
            self._publish_now()
            while True:
                await dirty.wait()
                if events.done():
                    events.result()
                    raise RuntimeError(f"{self.resource_name}: the folder watcher stopped")
                dirty.clear()
                if not self._rewatch(watcher):
                    dirty.set()
                self._publish_now()
        finally:
            events.cancel()
            await asyncio.gather(events, return_exceptions=True)
            watcher.close()


def _node(host_path: str, container_path: str, permissions: str) -> DeviceNode:
    return DeviceNode(host_path, container_path or host_path, permissions)


def _folders_of(path: str) -> list[tuple[str, str]]:
    """(folder, name pattern) pairs to watch for `path`, a literal path or a glob."""
    parts = posixpath.normpath(path).split("/")[1:]
    # Components before the first glob one (for a literal path: all but the last).
    static = next((i for i, part in enumerate(parts) if has_glob(part)), len(parts) - 1)
    # The nearest existing folder of the static prefix.
    depth = static
    while depth > 0 and not os.path.isdir("/" + "/".join(parts[:depth])):
        depth -= 1
    pairs = [("/" + "/".join(parts[:depth]), parts[depth])]
    if depth < static:
        return pairs
    # Every existing folder matching each longer prefix, up to the last component.
    for depth in range(static + 1, len(parts)):
        prefix = "/" + "/".join(parts[:depth])
        pairs += [(f, parts[depth]) for f in glob.glob(prefix) if os.path.isdir(f)]
    return pairs
