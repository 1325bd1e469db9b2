"""Atomic file replacement: the one way devplug writes a file that others read, and
`OwnedFile`, which replaces and removes only a file devplug wrote."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path


def write_atomic(
    path: Path | str,
    data: str | bytes | bytearray,
    mode: int = 0o644,
    *,
    durable: bool = True,
    sync_folder: bool = True,
) -> bool:
    """Replace `path` with `data` through a temporary file in the same folder and a
    rename, so a reader sees the old file or the new one, never a partial one.

    `durable` syncs the data and then the folder to disk, so the new file survives a
    crash of the machine; state that a crash may lose (a simulator's pod list) skips
    both syncs. `sync_folder=False` syncs the data only, as the kubelet writes its
    checkpoints (pkg/kubelet/util/store: write, fsync, close, rename).

    Returns False, writing nothing, when the file already holds `data` (no needless
    inotify events for watchers such as node-feature-discovery).
    """
    target = Path(path)
    content = data.encode() if isinstance(data, str) else data
    with contextlib.suppress(OSError):
        # Read the old file only when it may hold the same bytes (a big file that
        # changes on every write, a checkpoint, is not read back each time).
        if os.stat(target).st_size == len(content) and target.read_bytes() == content:
            return False
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            os.fchmod(f.fileno(), mode)
            if durable:
                os.fsync(f.fileno())
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    if durable and sync_folder:
        folder = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    return True


def remove_quietly(path: Path | str) -> None:
    """Remove a file devplug wrote; a file already gone is fine."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class NotOurs(OSError):
    """A file at a path devplug writes that devplug did not write: it is left alone."""


class OwnedElsewhere(OSError):
    """A path another live devplug owns (it holds the path's owner lock): left alone,
    and written here once that one stops."""


FileIdentity = tuple[int, int, int]


def _identity(path: Path) -> FileIdentity | None:
    try:
        st = path.lstat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns)


class OwnerLock:
    """Who owns a shared path: the process that holds an exclusive `flock` on
    `.NAME.owner` beside it (a hidden name: CDI and node-feature-discovery skip dot
    files). The kernel drops the lock when its process ends, however it ends, so an owner
    is alive exactly while its lock is held, seen alike from any container or pid
    namespace that shares the folder. The lock file holds a line naming the owner (pid,
    host, command) for messages. An owner that stops removes the lock file while it
    still holds it, so a waiter that then gets the lock of the removed file tries again
    on the new one."""

    def __init__(self, path: Path) -> None:
        self.path = path.with_name(f".{path.name}.owner")
        self.fd: int | None = None
        self.held = False

    def acquire(self) -> bool:
        """Take the lock unless a live process holds it; True when held."""
        import fcntl

        if self.held and self.fd is not None:
            if self._is_at_path():
                return True
            os.close(self.fd)  # someone removed the lock file: take the path's lock anew
            self.fd, self.held = None, False
        for _ in range(8):  # owners come and go: try again on the file now at the path
            if self.fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                self.fd = os.open(self.path, flags, 0o644)
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # the fd stays open: no open/close events for the watchers
            if self._is_at_path():
                record = f"pid {os.getpid()} on {os.uname().nodename}: {_command()}\n"
                os.ftruncate(self.fd, 0)
                os.pwrite(self.fd, record.encode(), 0)
                self.held = True
                return True
            os.close(self.fd)  # the lock of a removed file: that owner stopped
            self.fd = None
        return False

    def _is_at_path(self) -> bool:
        assert self.fd is not None
        mine = os.fstat(self.fd)
        try:
            there = os.lstat(self.path)
        except FileNotFoundError:
            return False
        return (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino)

    def owner(self) -> str:
        """The line the owner wrote ('another devplug' when unreadable)."""
        try:
            with open(self.path, "rb") as f:
                line = f.read(512).decode(errors="replace").strip()
        except OSError:
            line = ""
        return line or "another devplug"

    def release(self) -> None:
        """Give the lock up, removing the lock file first when held (ours still)."""
        if self.fd is None:
            return
        if self.held and self._is_at_path():
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        os.close(self.fd)
        self.fd = None
        self.held = False


def _command() -> str:
    import sys

    return " ".join(sys.argv)[:200].replace("\n", " ")


class OwnedFile:
    """A file devplug keeps at `path` (a CDI spec, a feature file) and removes when it
    stops, never another's: a file found there that `ours` does not recognise in its
    content (another tool's, a link, a folder) is not replaced (NotOurs), a file someone
    replaced or rewrote since devplug's last write is not removed, and a path another
    live devplug owns (`OwnerLock`) is neither written nor removed (OwnedElsewhere) until
    that one stops: `restore` then writes it, as it rewrites a file that was removed or
    replaced while this process owns it (`FileKeeper` calls it on folder events)."""

    def __init__(self, path: Path | str, ours: Callable[[bytes], bool]) -> None:
        self.path = Path(path)
        self.ours = ours
        self.identity: FileIdentity | None = None  # of devplug's last write
        self.lock = OwnerLock(self.path)
        self.wanted: tuple[bytes, int] | None = None  # what the file should hold, its mode
        self.refused: FileIdentity | None = None  # another's file found here, left alone

    def write(self, data: str | bytes, mode: int = 0o644) -> bool:
        """`write_atomic`, once this process owns the path and the file there (if any)
        is devplug's; NotOurs or OwnedElsewhere if not."""
        content = data.encode() if isinstance(data, str) else data
        self.wanted = (content, mode)
        if not self.lock.acquire():
            raise OwnedElsewhere(
                f"{self.path} is kept by a live devplug ({self.lock.owner()}): left alone, "
                "and written here when that one stops"
            )
        if self.identity is None or _identity(self.path) != self.identity:
            try:
                self._check_found()
            except NotOurs:
                self.refused = _identity(self.path)
                raise
        changed = write_atomic(self.path, content, mode)
        self.identity = _identity(self.path)
        return changed

    def restore(self) -> bool:
        """Write the wanted content again if the file is gone or was replaced, or if the
        devplug that owned the path stopped; True when it did (or took the file over)."""
        if self.wanted is None:
            return False
        ours = self.lock.held and self.lock.acquire()  # still ours (its lock file there)?
        if ours and self.identity is not None and _identity(self.path) == self.identity:
            return False
        if self.refused is not None and _identity(self.path) == self.refused:
            return False  # said once already
        if not self.lock.acquire():
            return False
        self.write(*self.wanted)  # the same bytes may be there already: ours now
        return True

    def _check_found(self) -> None:
        try:
            st = self.path.lstat()
        except FileNotFoundError:
            return
        if not stat.S_ISREG(st.st_mode):
            raise NotOurs(f"{self.path} exists and is not a file devplug wrote: left alone")
        if not self.ours(self.path.read_bytes()):
            raise NotOurs(f"{self.path} exists and was not written by devplug: left alone")

    def remove(self) -> None:
        """Remove the file if this process owns it and it is still the one written
        last; give up the ownership (or the wait for it)."""
        if self.lock.held and self.identity is not None and _identity(self.path) == self.identity:
            remove_quietly(self.path)
        self.identity = None
        self.wanted = None
        self.lock.release()


class FileKeeper:
    """Keeps owned files in place while `run` runs: a file removed or replaced is written
    again, a path whose owner stopped is taken over. Driven by inotify on their folders
    (their names, and their owner locks: a lock file is closed when its owner's process
    ends, however it ends), no polling; `refresh()` after the set of files changed. A
    file someone else put there is left alone, with a warning."""

    def __init__(self, files: Callable[[], Iterable[OwnedFile]]) -> None:
        import asyncio

        self.files = files
        self._wake = asyncio.Event()

    def refresh(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        import asyncio
        import logging

        from devplug.ground.dirwatch import ENTRY_EVENTS, DirWatcher, Mask

        log = logging.getLogger("devplug.outputs")
        names: set[tuple[Path, str]] = set()

        def seen(folder: Path, name: str) -> None:
            if not name or (folder, name) in names:
                self._wake.set()

        watcher = DirWatcher(seen, ENTRY_EVENTS | Mask.CLOSE_WRITE)
        task = asyncio.create_task(watcher.run(), name="keep owned files")
        try:
            while True:
                self._wake.clear()
                kept = list(self.files())
                names.clear()
                for f in kept:
                    names.add((f.path.parent, f.path.name))
                    names.add((f.path.parent, f.lock.path.name))
                watcher.set_folders({f.path.parent for f in kept})
                for f in kept:
                    try:
                        if f.restore():
                            log.info("%s written again (removed, replaced or freed)", f.path)
                    except NotOurs as error:  # never replaced: said (once per file found)
                        log.warning("%s", error)
                    except OSError as error:  # the writer said it: the next change tries
                        log.debug("%s: %s", f.path, error)
                await self._wake.wait()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            watcher.close()


def keep_aside(path: Path) -> Path:
    """Rename the unusable file at `path` to a name of its own beside it (never over
    another file), so that a new one can be written there and nothing is lost."""
    for n in range(1, 1000):
        aside = path.with_name(f"{path.name}.unusable-{n}")
        try:
            os.link(path, aside)  # fails where `aside` exists: nothing replaced
        except FileExistsError:
            continue
        os.unlink(path)
        return aside
    raise FileExistsError(f"{path}: 999 unusable copies beside it already")
