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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from devplug.config.load import check_trusted
from devplug.framework import observe
from devplug.ground import inputs
from devplug.ground.dirwatch import ENTRY_EVENTS, DirWatcher, Mask
from devplug.ground.signals import RELOAD_SIGNAL, hold_reload_signal, take_held_reload
from devplug.sources import Config, ConfigError, build_plugins, parse_config
from devplug.sources.protocol import SourcePlugin
from devplug.sources.validate import plugins_to_serve

if TYPE_CHECKING:
    from devplug.framework.daemon import Daemon
    from devplug.framework.plugin import Plugin

# How `devplug serve` turns a checked config into the plugins it serves.
BuildPlugins = Callable[[Config], Sequence[SourcePlugin]]

log = logging.getLogger("devplug.sources.reload")


def read_text(path: Path) -> str | None:
    try:
        return inputs.read_text(path, what="the config")
    except inputs.InputError:
        return None  # `reload` says why; the next event tries again


def config_inputs(config: Config) -> tuple[list[Path], set[Path]]:
    """The other files a config reads (NVIDIA config files of `nvidia.nvidiaConfig`) and
    the folders to watch for them (a ConfigMap's folder for its keys)."""
    files: list[Path] = []
    folders: set[Path] = set()
    for resource in config.resources:
        ref = resource.nvidia.nvidia_config if resource.nvidia is not None else None
        if ref is None:
            continue
        from devplug.config.nvidiafile import inputs as read_by

        files += read_by(ref)
        folders.add(Path(ref.folder) if ref.folder else Path(ref.file or "/").parent)
    return files, folders


class ConfigReloader:
    """A daemon service that keeps the served resources in step with a config file (and
    the NVIDIA config files it names); `request()` asks for a reload as SIGHUP does (the
    node label choosing an NVIDIA config changed). Without `path`, the config is `text`
    (`devplug serve --nvidia-config`) and only the files it names are watched."""

    def __init__(
        self,
        path: Path | str | None,
        config: Config,
        build: BuildPlugins = build_plugins,
        text: str | None = None,
        followers: Sequence[Callable[[Config], None]] = (),
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.config = config
        self.build = build  # the same as at start-up, so a reload serves what a start would
        # Told each applied config: what the config sets beside the plugins (the
        # node feature file's path).
        self.followers = list(followers)
        self._fixed = text
        self._text = self._read()
        self._inputs = self._read_inputs(config)
        self._wake = asyncio.Event()
        self._asked = False

    def _read(self) -> str | None:
        return read_text(self.path) if self.path is not None else self._fixed

    @staticmethod
    def _read_inputs(config: Config) -> list[tuple[Path, str | None]]:
        return [(p, read_text(p)) for p in config_inputs(config)[0]]

    def request(self) -> None:
        """Reload now, even if no file changed."""
        self._asked = True
        self._wake.set()

    async def run(self, daemon: Daemon) -> None:
        wake = self._wake
        watcher: DirWatcher[Path] = DirWatcher(
            lambda _folder, _name: wake.set(), ENTRY_EVENTS | Mask.CLOSE_WRITE
        )

        def watch() -> None:
            folders = config_inputs(self.config)[1]
            if self.path is not None:
                folders.add(self.path.parent)
            for folder in folders - set(watcher.folders):
                with contextlib.suppress(OSError):  # a folder made later is not seen
                    watcher.watch(folder)  # (again, when it was replaced)

        watch()
        events = asyncio.create_task(watcher.run(), name="watch config")
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(RELOAD_SIGNAL, self.request)
        if take_held_reload():  # came during the start: the file may have changed since
            self.request()
        try:
            while True:
                await wake.wait()
                wake.clear()
                watch()
                text = self._read()
                forced, self._asked = self._asked, False
                if text is None and not forced:
                    continue
                others = self._read_inputs(self.config)
                if text == self._text and others == self._inputs and not forced:
                    continue
                self._inputs = others
                await self.reload(daemon, text)
                self._inputs = self._read_inputs(self.config)
                watch()
        finally:
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(RELOAD_SIGNAL)
            hold_reload_signal()  # and not the default, which would end the process
            events.cancel()
            await asyncio.gather(events, return_exceptions=True)
            watcher.close()

    async def reload(self, daemon: Daemon, text: str | None) -> bool:
        """Apply the config `text` (None: unreadable); False when it is refused."""
        try:
            if self.path is not None:
                check_trusted(self.path)
            if text is None:
                assert self.path is not None
                inputs.read_text(self.path, what="the config")  # raises: says why
                raise ConfigError(f"{self.path}: cannot read the config")
            source = str(self.path or "--nvidia-config")
            config = parse_config(text, source)
            if config.node_events != self.config.node_events:
                raise ConfigError(
                    f"{source}: nodeEvents: a change takes effect when devplug serve starts "
                    "again (its API server client is made at the start)"
                )
            # What `serve` and `check` would refuse, before any change.
            built = plugins_to_serve(config, source, self.build, daemon.plugin_dir)
            plugins = {p.resource_name: p for p in built}
        except (ConfigError, ValueError) as error:  # InputError is a ValueError
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
        settings = changed_settings(self.config, config)
        self.config = config
        for follower in self.followers:
            follower(config)
        summary = ", ".join(
            f"{what} {', '.join(names)}"
            for what, names in (
                ("added", added),
                ("removed", removed),
                ("changed", changed),
                ("set", settings),
            )
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
            settings=settings,
        )
        return True


def changed_settings(old: Config, new: Config) -> list[str]:
    """The top-level keys other than `resources` whose values differ, as the config
    spells them ('limits', 'nodeFeatures')."""
    return [
        field.encode_name
        for field in msgspec.structs.fields(Config)
        if field.name != "resources" and getattr(old, field.name) != getattr(new, field.name)
    ]


def _built_from(plugin: Plugin) -> tuple[object, object, object]:
    """What a plugin is built from: its resource's spec, for one model of a split
    resource its pool (a per-model or NVML-derived resource has a spec of its own, so it
    is compared as itself, not by its entry's name), and the config's `limits` (its
    server's options and bounds are set when it starts)."""
    if isinstance(plugin, SourcePlugin):
        return plugin.spec, plugin.pool, plugin.limits
    return None, None, plugin.limits
