"""Plugins described by a config file: host device nodes and virtual devices.

config = load_config("devplug.yaml")       # raises ConfigError, one line
plugins = build_plugins(config)            # one Plugin per resource
await devplug.framework.daemon.serve(plugins, plugin_dir)
"""

from __future__ import annotations

import msgspec

from devplug.outputs.cdi import default_kind
from devplug.sources.config import (
    Config,
    ConfigError,
    ResourceSpec,
    load_config,
    load_default_config,
    parse_config,
)
from devplug.sources.hostdev import HostDevicePlugin
from devplug.sources.sysfs.select import Pool
from devplug.sources.sysfs.tree import Sysfs
from devplug.sources.virtual import VirtualPlugin

# Both kinds offer `discover()` (the devices to serve now, without publishing) and
# `warnings` (one-line messages, e.g. a glob that matches nothing).
SourcePlugin = HostDevicePlugin | VirtualPlugin

__all__ = [
    "Config",
    "ConfigError",
    "HostDevicePlugin",
    "ResourceSpec",
    "SourcePlugin",
    "VirtualPlugin",
    "build_plugin",
    "build_plugins",
    "load_config",
    "load_default_config",
    "parse_config",
    "resource_names",
]


def resource_names(config: Config) -> list[str]:
    """The resources a config serves: one per entry, one per model of a split entry."""
    return [
        f"{spec.name}-{model}" if spec.split else spec.name
        for spec in config.resources
        for model in (spec.split.models.values() if spec.split else [""])
    ]


def build_plugin(spec: ResourceSpec, sysfs: Sysfs | None = None) -> SourcePlugin:
    """The plugin of one checked resource (not split into pools)."""
    if spec.virtual is not None:
        return VirtualPlugin(spec)
    return HostDevicePlugin(spec, sysfs)


def build_plugins(
    config: Config, *, sysfs_root: str | None = None, dev_root: str | None = None
) -> list[SourcePlugin]:
    """One plugin per resource of a config returned by `load_config`, one per model for
    a resource with `split`; the roots override the config's `sysfsRoot`/`devRoot`."""
    sysfs = Sysfs(sysfs_root or config.sysfs_root, dev_root or config.dev_root)
    plugins: list[SourcePlugin] = []
    for spec in config.resources:
        if spec.split is None:
            plugins.append(build_plugin(spec, sysfs))
            continue
        for value, model in spec.split.models.items():
            name = f"{spec.name}-{model}"
            cdi = spec.cdi
            if cdi is not None and cdi.kind is not None:
                cdi = msgspec.structs.replace(cdi, kind=default_kind(f"{cdi.kind}-{model}"))
            pool_spec = msgspec.structs.replace(spec, name=name, split=None, cdi=cdi)
            plugins.append(HostDevicePlugin(pool_spec, sysfs, Pool(spec.split.by, value, model)))
    return plugins
