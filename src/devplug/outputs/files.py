"""Atomic file replacement: the one way devplug writes a file that others read, and
`OwnedFile`, which replaces and removes only a file devplug wrote."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable
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


FileIdentity = tuple[int, int, int]


def _identity(path: Path) -> FileIdentity | None:
    try:
        st = path.lstat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns)


class OwnedFile:
    """A file devplug keeps at `path` (a CDI spec, a feature file) and removes when it
    stops, never another's: a file found there that `ours` does not recognise in its
    content (another tool's, a link, a folder) is not replaced (NotOurs), and a file
    someone replaced or rewrote since devplug's last write is not removed."""

    def __init__(self, path: Path | str, ours: Callable[[bytes], bool]) -> None:
        self.path = Path(path)
        self.ours = ours
        self.identity: FileIdentity | None = None  # of devplug's last write

    def write(self, data: str | bytes, mode: int = 0o644) -> bool:
        """`write_atomic`, once the file there (if any) is devplug's; NotOurs if not."""
        if self.identity is None or _identity(self.path) != self.identity:
            self._check_found()
        changed = write_atomic(self.path, data, mode)
        self.identity = _identity(self.path)
        return changed

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
        """Remove the file if it is still the one devplug wrote last."""
        if self.identity is not None and _identity(self.path) == self.identity:
            remove_quietly(self.path)
        self.identity = None


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
