"""Config reload while serving: on SIGHUP and whenever the config file changes.

A Kubernetes ConfigMap volume updates by an atomic symlink swap (a new `..data` link
renamed over the old one, the file itself a link through it), so the file's folder is
watched, not the file: every entry event or finished write there re-reads the file,
and only a changed text (or SIGHUP) goes further. The new config is checked in full
before anything changes; a bad one is refused with its one-line error and the running
config keeps serving. Resources are compared by their spec: an unchanged one keeps its
socket and streams, a removed one stops, an added one is served, a changed one is
served again from its new spec (all of them when `sysfsRoot` or `devRoot` changes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from asyncinotify import Mask

from devplug.framework import observe
from devplug.framework.dirwatch import ENTRY_EVENTS, DirWatcher
from devplug.framework.unixserver import socket_path_problem
from devplug.sources import Config, ConfigError, build_plugins, parse_config

if TYPE_CHECKING:
    from devplug.framework.daemon import Daemon
    from devplug.framework.plugin import Plugin

# How `devplug serve` turns a checked config into the plugins it serves.
BuildPlugins = Callable[[Config], Sequence["Plugin"]]

log = logging.getLogger("devplug.sources.reload")


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None  # parse_config via load would say why; the next event tries again


class ConfigReloader:
    """A daemon service that keeps the served resources in step with a config file."""

    def __init__(
        self, path: Path | str, config: Config, build: BuildPlugins = build_plugins
    ) -> None:
        self.path = Path(path)
        self.config = config
        self.build = build  # the same as at start-up, so a reload serves what a start would
        self._text = read_text(self.path)

    async def run(self, daemon: Daemon) -> None:
        wake = asyncio.Event()
        asked = False

        def on_hup() -> None:
            nonlocal asked
            asked = True
            wake.set()

        folder = self.path.parent
        watcher = DirWatcher(lambda _folder, _name: wake.set(), ENTRY_EVENTS | Mask.CLOSE_WRITE)
        watcher.watch(folder)
        events = asyncio.create_task(watcher.run(), name="watch config")
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, on_hup)
        try:
            while True:
                await wake.wait()
                wake.clear()
                if folder not in watcher.folders:
                    watcher.watch(folder)  # the folder was replaced
                text = read_text(self.path)
                forced, asked = asked, False
                if text is None and not forced:
                    continue
                if text == self._text and not forced:
                    continue
                await self.reload(daemon, text)
        finally:
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signal.SIGHUP)
            events.cancel()
            await asyncio.gather(events, return_exceptions=True)
            watcher.close()

    async def reload(self, daemon: Daemon, text: str | None) -> bool:
        """Apply the config `text` (None: unreadable); False when it is refused."""
        try:
            if text is None:
                raise ConfigError(f"{self.path}: cannot read the config")
            config = parse_config(text, str(self.path))
            plugins = {p.resource_name: p for p in self.build(config)}
            for plugin in plugins.values():  # what Daemon.add would refuse, before any change
                if problem := socket_path_problem(daemon.plugin_dir / plugin.socket_name):
                    raise ValueError(f"{plugin.resource_name}: {problem}")
        except (ConfigError, ValueError) as error:
            self._text = text
            observe.emit(
                observe.RELOAD_REFUSED,
                "",
                f"config reload refused, the previous config keeps serving: {error}",
                logging.ERROR,
                error=str(error),
            )
            return False
        self._text = text
        served = {p.resource_name: _built_from(p) for p in daemon.plugins}
        removed = [n for n in served if n not in plugins]
        added = [n for n in plugins if n not in served]
        # Other roots: every resource may see other devices, so each is served again.
        moved = (config.sysfs_root, config.dev_root) != (
            self.config.sysfs_root,
            self.config.dev_root,
        )
        changed = [
            n for n in plugins if n in served and (moved or _built_from(plugins[n]) != served[n])
        ]
        kept = [n for n in plugins if n in served and n not in changed]
        for name in removed + changed:
            await daemon.remove(name)
        for name in changed + added:
            daemon.add(plugins[name])
        self.config = config
        summary = ", ".join(
            f"{what} {', '.join(names)}"
            for what, names in (("added", added), ("removed", removed), ("changed", changed))
            if names
        )
        observe.emit(
            observe.RELOADED,
            "",
            f"config reloaded from {self.path}: {summary or 'nothing changed'}"
            + (f"; kept {len(kept)} unchanged" if kept else ""),
            added=added,
            removed=removed,
            changed=changed,
            kept=kept,
        )
        return True


def _built_from(plugin: Plugin) -> tuple[object, object]:
    """What a plugin is built from: its resource's spec, and for one model of a split
    resource its pool (a per-model or NVML-derived resource has a spec of its own, so it
    is compared as itself, not by its entry's name)."""
    return getattr(plugin, "spec", None), getattr(plugin, "pool", None)
