"""Folder watching through inotify: the one way devplug notices file changes.

Used for the device-plugins folder (kubelet restarts, our sockets removed) and for
the folders that hold device nodes (health, new glob matches). Event-driven, so an
idle daemon costs no CPU and a change is seen in milliseconds.

The three inotify calls are made through ctypes on the symbols the interpreter already
has (libc), not through an inotify library: the one the tests use (asyncinotify) looks
libc up with `ctypes.util.find_library` at import, which runs `ldconfig` in a child
process and pulls in tempfile, shutil, bz2 and lzma, and cost every daemon start 1.5 MiB
of memory and tens of milliseconds before it could register (`make bench`, "floor").
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import struct
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

log = logging.getLogger("devplug.dirwatch")


class Mask:
    """inotify's event bits (linux/inotify.h), as plain ints: an enum.IntFlag of them
    costs every daemon start a millisecond or two to build."""

    ACCESS = 0x1
    MODIFY = 0x2
    ATTRIB = 0x4
    CLOSE_WRITE = 0x8
    CLOSE_NOWRITE = 0x10
    OPEN = 0x20
    MOVED_FROM = 0x40
    MOVED_TO = 0x80
    CREATE = 0x100
    DELETE = 0x200
    DELETE_SELF = 0x400
    MOVE_SELF = 0x800
    UNMOUNT = 0x2000
    Q_OVERFLOW = 0x4000
    IGNORED = 0x8000
    ONLYDIR = 0x1000000
    DONT_FOLLOW = 0x2000000
    EXCL_UNLINK = 0x4000000
    MASK_ADD = 0x20000000
    ISDIR = 0x40000000
    ONESHOT = 0x80000000


ENTRY_EVENTS = (
    Mask.CREATE
    | Mask.DELETE
    | Mask.MOVED_FROM
    | Mask.MOVED_TO
    | Mask.DELETE_SELF
    | Mask.MOVE_SELF
    | Mask.ONLYDIR
)
_GONE = Mask.IGNORED | Mask.DELETE_SELF | Mask.MOVE_SELF
_HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then the name
_READ_BYTES = 64 * 1024

# A folder as the caller names it (a pathlib.Path, or a str where pathlib is not
# loaded otherwise: the plugin daemon), handed back to its callback as given.
Folder = TypeVar("Folder", bound="str | os.PathLike[str]")

_libc: ctypes.CDLL | None = None


def _inotify() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)  # the interpreter's own libc
        libc.inotify_init1.argtypes = (ctypes.c_int,)
        libc.inotify_add_watch.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        libc.inotify_rm_watch.argtypes = (ctypes.c_int, ctypes.c_int)
        _libc = libc
    return _libc


def _events(data: bytes) -> Iterator[tuple[int, int, str]]:
    """(watch descriptor, mask, name) of each event in what one read returned."""
    offset, size = 0, _HEADER.size
    while offset + size <= len(data):
        wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
        offset += size
        name = data[offset : offset + length].split(b"\0", 1)[0]
        offset += length
        yield wd, mask, os.fsdecode(name)


class DirWatcher(Generic[Folder]):
    """Watches folders; `callback` is called with the watched folder and the entry's
    name, the name "" when the folder itself went away (its watch is then dropped and
    must be added again)."""

    def __init__(self, callback: Callable[[Folder, str], None], mask: int = ENTRY_EVENTS) -> None:
        self._callback = callback
        self._mask = mask
        fd = _inotify().inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            error = ctypes.get_errno()
            raise OSError(error, f"inotify: {os.strerror(error)}")
        self._fd = fd
        self._watches: dict[Folder, int] = {}
        self._folders: dict[int, Folder] = {}  # by watch descriptor, until IGNORED
        self._reader: asyncio.AbstractEventLoop | None = None  # the loop `run` reads in

    @property
    def folders(self) -> set[Folder]:
        return set(self._watches)

    def watch(self, folder: Folder) -> bool:
        """Start watching `folder`; False when it does not exist (or is no folder)."""
        if folder in self._watches:
            return True
        if self._fd < 0:
            return False
        wd = _inotify().inotify_add_watch(self._fd, os.fsencode(folder), self._mask)
        if wd < 0:
            return False
        self._watches[folder] = wd
        self._folders.setdefault(wd, folder)  # the same inode by a second name: the first
        return True

    def unwatch(self, folder: Folder) -> None:
        wd = self._watches.pop(folder, None)
        if wd is not None and self._fd >= 0:
            # -1 (ignored): the kernel dropped it already (folder removed).
            _inotify().inotify_rm_watch(self._fd, wd)

    def set_folders(self, folders: set[Folder]) -> None:
        for folder in self.folders - folders:
            self.unwatch(folder)
        for folder in folders:
            self.watch(folder)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        readable = asyncio.Event()
        loop.add_reader(self._fd, readable.set)
        self._reader = loop
        try:
            while True:
                await readable.wait()
                readable.clear()
                while self._fd >= 0:
                    try:
                        data = os.read(self._fd, _READ_BYTES)
                    except BlockingIOError:
                        break
                    for wd, mask, name in _events(data):
                        self._dispatch(wd, mask, name)
        finally:
            self._stop_reading()

    def _stop_reading(self) -> None:
        if self._reader is not None and self._fd >= 0:
            self._reader.remove_reader(self._fd)
        self._reader = None

    def _dispatch(self, wd: int, mask: int, name: str) -> None:
        folder = self._folders.get(wd)
        if folder is None:  # a queue overflow (wd -1), or a watch already dropped
            return
        if mask & Mask.IGNORED:
            del self._folders[wd]
        if mask & _GONE:
            if self._watches.get(folder) == wd:
                del self._watches[folder]
            self._callback(folder, "")
            return
        self._callback(folder, name)

    def close(self) -> None:
        """Stop watching; a `run` still going then waits for nothing more (the loop
        forgets the descriptor before it is closed and its number reused)."""
        self._stop_reading()
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
