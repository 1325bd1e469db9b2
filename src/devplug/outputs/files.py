"""Atomic file replacement: the one way devplug writes a file that others read."""

from __future__ import annotations

import contextlib
import os
import tempfile
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
