"""The kubelet's plugin folder at start-up: refuse to start beside a live kubelet, and
remove what a starting kubelet removes, short of harming anyone.

The kubelet's device manager wipes the plugin folder when it starts; the simulator
removes only sockets nobody answers on and those of the plugins that registered with
it, so that a plugin of another live process keeps its socket.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
from collections.abc import Iterable
from pathlib import Path

from devplug.ground.files import keep_aside
from devplug.ground.unixserver import SocketPathTaken, socket_holder

log = logging.getLogger("devplug.simulator.kubelet")


def refuse_beside_a_kubelet(paths: Iterable[Path | None]) -> None:
    """Raise SocketPathTaken, naming the socket and its process, when a kubelet or
    another simulator answers on one of the sockets this one would serve: starting
    would take them over (and its plugins' sockets with them)."""
    for path in paths:
        if path is not None and (holder := socket_holder(path)) is not None:
            raise SocketPathTaken(
                f"{path} is served by {holder}: a kubelet (or another simulator) runs "
                "on this folder; the simulator does not start beside it"
            )


def cleanup_plugin_dir(plugin_dir: Path, keep: set[Path], registered: set[Path]) -> None:
    """Remove sockets nobody answers on, and the sockets of the plugins that registered
    with this simulator (`registered`: a restart). A socket of another live process,
    files, links, folders and the paths in `keep` stay."""
    removed, left = [], []
    for path in sorted(plugin_dir.iterdir()):
        if path in keep:
            continue
        try:
            mode = path.lstat().st_mode
        except OSError as error:
            log.error("failed to stat %s: %s", path, error)
            continue
        if not stat.S_ISSOCK(mode):
            continue
        if path not in registered and socket_holder(path) is not None:
            left.append(path.name)
            continue
        try:
            path.unlink()
        except OSError as error:
            log.error("failed to remove %s: %s", path, error)
            continue
        removed.append(path.name)
    if removed:
        log.info("removed plugin sockets from %s: %s", plugin_dir, ", ".join(removed))
    if left:
        log.info(
            "left the sockets of live processes in %s: %s (they register when they see "
            "kubelet.sock)",
            plugin_dir,
            ", ".join(left),
        )


def kept_aside(path: Path) -> Path | str:
    """An unusable state file renamed aside (never overwritten): where it went."""
    try:
        return keep_aside(path)
    except OSError as error:
        return f"where it was ({error.strerror or error})"


def leave_dead_socket(path: Path) -> None:
    """A socket file at `path` that nobody listens on, as a killed process leaves its
    listening socket: connecting to it is refused."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        dead.bind(os.fspath(path))
    finally:
        dead.close()
