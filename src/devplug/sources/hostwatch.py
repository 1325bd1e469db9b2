"""Which folders a host device resource watches, so that a node made, removed or
renamed is seen at once: the folder of each path (or its nearest existing ancestor),
for a glob the folders that match its components up to the last, and for sysfs
selectors the bus folders, /dev and the folders of the nodes seen."""

from __future__ import annotations

import glob
import logging
import os
import posixpath
from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING

from devplug.config.groups import GroupSpec, has_glob, is_selector

if TYPE_CHECKING:
    from devplug.framework.device import DeviceNode
    from devplug.ground.dirwatch import DirWatcher
    from devplug.sources.sysfs.tree import Sysfs

log = logging.getLogger("devplug.sources")


def folders(
    groups: Sequence[GroupSpec], sysfs: Sysfs | None, selected_nodes: Iterable[DeviceNode]
) -> dict[Path, set[str]]:
    """The folders to watch now, each with the name patterns relevant in it; `sysfs`
    where a group selects devices there, with the nodes of the devices it selected."""
    interest: dict[Path, set[str]] = {}
    for group in groups:
        if is_selector(group):
            continue
        # The mounts whose presence matters (required or optional) too.
        mounts = [m.host_path for m in group.mounts if m.required or m.optional]
        for path in [*(spec.path for spec in group.paths), *mounts]:
            for folder, pattern in _folders_of(path):
                interest.setdefault(Path(folder), set()).add(pattern)
    if sysfs is not None:
        # The bus folders (a device's link comes and goes), /dev and the folders of
        # the nodes seen (a node made or removed after its device).
        watched = [sysfs.bus_folder("usb"), sysfs.bus_folder("pci"), sysfs.dev_root]
        watched += [Path(n.host_path).parent for n in selected_nodes]
        for place in watched:
            interest.setdefault(_existing(place), set()).add("*")
    return interest


class FolderWatch:
    """The folders one resource watches now, on `watcher`, and the names that matter in
    each (`resource` names it in the log)."""

    def __init__(self, resource: str, watcher: DirWatcher[Path]) -> None:
        self.resource = resource
        self.watcher = watcher
        self._interest: dict[Path, set[str]] = {}
        self._unwatchable: set[Path] = set()

    def relevant(self, folder: Path, name: str) -> bool:
        if not name:  # a watched folder itself went away
            return True
        return any(fnmatchcase(name, p) for p in self._interest.get(folder, ()))

    def rewatch(self, interest: dict[Path, set[str]]) -> bool:
        """Watch the folders of `interest`; False if one vanished before it could be
        watched (look again: its parent is watched instead)."""
        self._interest = interest
        self.watcher.set_folders(set(interest))
        missing = set(interest) - self.watcher.folders
        vanished = {f for f in missing if not f.is_dir()}
        # Present but refused (e.g. the inotify watch limit): say so once, and do not
        # retry in a loop; the next event elsewhere tries again.
        for folder in sorted(missing - vanished - self._unwatchable):
            log.warning("%s: cannot watch %s: changes in it are missed", self.resource, folder)
        self._unwatchable = missing - vanished
        return not vanished


def _existing(folder: Path) -> Path:
    """`folder`, or its nearest existing ancestor (watched until it appears)."""
    while not folder.is_dir() and folder.parent != folder:
        folder = folder.parent
    return folder


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
