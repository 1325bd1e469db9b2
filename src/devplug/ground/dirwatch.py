"""Folder watching through inotify: the one way devplug notices file changes.

Used for the device-plugins folder (kubelet restarts, our sockets removed) and for
the folders that hold device nodes (health, new glob matches). Event-driven, so an
idle daemon costs no CPU and a change is seen in milliseconds.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

from asyncinotify import Inotify, Mask, Watch

log = logging.getLogger("devplug.dirwatch")

ENTRY_EVENTS = (
    Mask.CREATE
    | Mask.DELETE
    | Mask.MOVED_FROM
    | Mask.MOVED_TO
    | Mask.DELETE_SELF
    | Mask.MOVE_SELF
    | Mask.ONLYDIR
)

# Called with the watched folder and the entry's name; the name is "" when the folder
# itself went away (its watch is then dropped and must be added again).
Callback = Callable[[Path, str], None]


class DirWatcher:
    def __init__(self, callback: Callback, mask: Mask = ENTRY_EVENTS) -> None:
        self._callback = callback
        self._mask = mask
        self._inotify = Inotify()
        self._watches: dict[Path, Watch] = {}

    @property
    def folders(self) -> set[Path]:
        return set(self._watches)

    def watch(self, folder: Path) -> bool:
        """Start watching `folder`; False when it does not exist (or is no folder)."""
        if folder in self._watches:
            return True
        try:
            self._watches[folder] = self._inotify.add_watch(folder, self._mask)
        except OSError:
            return False
        return True

    def unwatch(self, folder: Path) -> None:
        watch = self._watches.pop(folder, None)
        if watch is not None:
            # ValueError/OSError: the kernel dropped it already (folder removed).
            with contextlib.suppress(OSError, ValueError):
                self._inotify.rm_watch(watch)

    def set_folders(self, folders: set[Path]) -> None:
        for folder in self.folders - folders:
            self.unwatch(folder)
        for folder in folders:
            self.watch(folder)

    async def run(self) -> None:
        async for event in self._inotify:
            folder = event.watch.path if event.watch is not None else None
            if folder is None:
                continue
            if event.mask & (Mask.IGNORED | Mask.DELETE_SELF | Mask.MOVE_SELF):
                if self._watches.get(folder) is event.watch:
                    del self._watches[folder]
                self._callback(folder, "")
                continue
            self._callback(folder, event.name.name if event.name is not None else "")

    def close(self) -> None:
        self._inotify.close()
