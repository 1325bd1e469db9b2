"""Fault scenario 4 (tests/faults.py): the socket folder missing, deleted, unwritable,
or holding a stale socket of our name."""

from __future__ import annotations

import os
import re
import socket
import stat
import time
from pathlib import Path

from fault_harness import (
    VIRT,
    WAIT_S,
    Outcome,
    Serve,
    new_kubelet,
    serving,
    virt_config,
    wait_for_path,
)

from devplug.framework.plugin import default_socket_name

# -- 4. socket folder trouble -------------------------------------------------------------


async def folder_missing_at_start(root: Path) -> list[str]:
    """Started before the folder (and its parent) exist: it makes them and serves."""
    problems: list[str] = []
    plugin_dir = root / "later" / "plugins"
    async with serving(Serve(root, virt_config(3), plugin_dir)) as serve:
        socket_path = plugin_dir / default_socket_name(VIRT)
        # Each step watches a folder that exists, then looks: nothing is missed.
        for path in (plugin_dir.parent, plugin_dir):
            await wait_for_path(path, path.is_dir, f"{path}")
        await wait_for_path(socket_path, socket_path.is_socket, "the plugin socket")
        async with new_kubelet(root, plugin_dir) as kubelet:
            await kubelet.wait_for_resource(VIRT, count=3, timeout=WAIT_S)
            if kubelet.registrations(VIRT) != 1:
                problems.append(f"{kubelet.registrations(VIRT)} registrations")
        if not serve.running:
            problems.append("the daemon exited")
    return problems


async def folder_deleted_while_serving(root: Path) -> list[str]:
    """The whole folder removed under a serving daemon, then a kubelet starts in a new
    one: the daemon serves again there and registers."""
    import shutil

    problems: list[str] = []
    plugin_dir = root / "plugins"
    async with serving(Serve(root, virt_config(3), plugin_dir)) as serve:
        async with new_kubelet(root, plugin_dir) as kubelet:
            await kubelet.wait_for_resource(VIRT, count=3, timeout=WAIT_S)
            await kubelet.stop()
            # Moved out of the way, then deleted: a daemon quick to serve again cannot
            # slip a new socket into the folder while it is being emptied.
            gone = root / "gone"
            plugin_dir.rename(gone)
            shutil.rmtree(gone)
            await kubelet.start()
            await kubelet.wait_for_registration(VIRT, after=1, timeout=WAIT_S)
            await kubelet.wait_for_resource(VIRT, count=3, timeout=WAIT_S)
        if not serve.running:
            problems.append("the daemon exited")
    return problems


def dead_socket(path: Path) -> None:
    """A socket file nobody serves, as a killed process leaves it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(os.fspath(path))
    sock.close()


async def stale_socket_of_the_same_name(root: Path) -> list[str]:
    """A dead socket at the plugin's path is replaced; a regular file or a symbolic
    link there is left alone (with an error in the log) until it goes away."""
    problems: list[str] = []
    plugin_dir = root / "plugins"
    plugin_dir.mkdir()
    outside = root / "precious"
    outside.write_text("keep me")
    socket_path = plugin_dir / default_socket_name(VIRT)
    for kind in ("dead socket", "file", "symlink"):
        if kind == "dead socket":
            dead_socket(socket_path)
        elif kind == "file":
            socket_path.write_text("not mine")
        else:
            socket_path.symlink_to(outside)
        serve = Serve(root, virt_config(3), plugin_dir, name=f"serve-{kind.replace(' ', '-')}")
        async with new_kubelet(root, plugin_dir) as kubelet, serving(serve):
            if kind != "dead socket":
                await serve.wait_for_log("not removed|left alone")
                if kind == "file" and socket_path.read_text() != "not mine":
                    problems.append("the file was changed")
                if kind == "symlink" and not (
                    socket_path.is_symlink() and outside.read_text() == "keep me"
                ):
                    problems.append("the link or its target was changed")
                socket_path.unlink()  # the owner clears it: the daemon serves at once
            await kubelet.wait_for_resource(VIRT, count=3, timeout=WAIT_S)
            if not serve.running:
                problems.append(f"{kind}: the daemon exited")
    return problems


async def permission_denied(root: Path) -> list[str]:
    """A folder the daemon may not write: a clear error (at error level once, then at
    debug), retried with backoff (the delays double), served as soon as the permission
    is given."""
    problems: list[str] = []
    plugin_dir = root / "plugins"
    plugin_dir.mkdir(mode=0o555)
    plugin_dir.chmod(0o555)
    serve = Serve(root, virt_config(3), plugin_dir)
    serve.start(without_dac_override=True, log_level="debug")
    async with serving(serve):
        lines = await serve.wait_for_log(r"Permission denied; retrying in", count=2)
        levels = [line.split()[1] for line in lines[:2]]
        if levels != ["ERROR", "DEBUG"]:
            problems.append(f"the cause said more than once: {levels}")
        delays = [float(re.findall(r"retrying in ([0-9.]+) s", line)[0]) for line in lines[:2]]
        if delays[1] <= delays[0]:
            problems.append(f"no backoff: {delays}")
        if not serve.running:
            problems.append("the daemon exited")
        socket_path = plugin_dir / default_socket_name(VIRT)
        plugin_dir.chmod(0o755)
        await wait_for_path(socket_path, socket_path.is_socket, "the socket after the fix")
        if stat.S_IMODE(socket_path.stat().st_mode) != 0o600:
            problems.append(f"socket mode {oct(socket_path.stat().st_mode)}")
        async with new_kubelet(root, plugin_dir) as kubelet:
            await kubelet.wait_for_resource(VIRT, count=3, timeout=WAIT_S)
    return problems


async def folder_cannot_be_made(root: Path) -> list[str]:
    """The folder is missing and its parent may not be written: a clear error,
    retried with backoff instead of exiting; made and served once that is fixed."""
    problems: list[str] = []
    parent = root / "readonly"
    parent.mkdir()
    parent.chmod(0o555)
    plugin_dir = parent / "plugins"
    serve = Serve(root, virt_config(3), plugin_dir)
    serve.start(without_dac_override=True, log_level="debug")
    async with serving(serve):
        lines = await serve.wait_for_log(r"cannot create the plugin folder .*retrying in", 2)
        levels = [line.split()[1] for line in lines[:2]]
        if levels != ["ERROR", "DEBUG"]:
            problems.append(f"the cause said more than once: {levels}")
        delays = [float(re.findall(r"retrying in ([0-9.]+) s", line)[0]) for line in lines[:2]]
        if delays[1] <= delays[0]:
            problems.append(f"no backoff: {delays}")
        if not serve.running:
            problems.append("the daemon exited")
        parent.chmod(0o755)
        socket_path = plugin_dir / default_socket_name(VIRT)
        for path in (plugin_dir, socket_path):
            await wait_for_path(path, path.exists, f"{path} after the fix")
        async with new_kubelet(root, plugin_dir) as kubelet:
            await kubelet.wait_for_resource(VIRT, count=3, timeout=WAIT_S)
    return problems


FOLDER_TROUBLES = {
    "parent not writable": folder_cannot_be_made,
    "missing at start": folder_missing_at_start,
    "deleted while serving": folder_deleted_while_serving,
    "stale socket of the same name": stale_socket_of_the_same_name,
    "permission denied": permission_denied,
}


async def folder_trouble(root: Path, rounds: int) -> Outcome:
    out = Outcome("socket folder trouble")
    started = time.monotonic()
    for round_ in range(1, rounds + 1):
        for name, scenario in FOLDER_TROUBLES.items():
            where = root / f"{round_}-{name.split()[0]}"
            where.mkdir()
            for problem in await scenario(where):
                out.failures.append(f"round {round_}: {name}: {problem}")
        out.iterations = round_
    out.wall_s = time.monotonic() - started
    return out
