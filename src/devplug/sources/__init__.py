"""Plugins described by a config file: host device nodes and virtual devices.

config = load_config("devplug.yaml")       # raises ConfigError, one line
plugins = build_plugins(config)            # one Plugin per resource
await devplug.framework.daemon.serve(plugins, plugin_dir)
"""

from __future__ import annotations

from devplug.sources.config import (
    Config,
    ConfigError,
    ResourceSpec,
    load_config,
    load_default_config,
    parse_config,
)
from devplug.sources.hostdev import HostDevicePlugin
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
]


def build_plugin(spec: ResourceSpec) -> SourcePlugin:
    """The plugin of one checked resource."""
    if spec.virtual is not None:
        return VirtualPlugin(spec)
    return HostDevicePlugin(spec)


def build_plugins(config: Config) -> list[SourcePlugin]:
    """One plugin per resource of a config returned by `load_config`."""
    plugins = [build_plugin(spec) for spec in config.resources]
    limits = config.limits.to_limits()
    for plugin in plugins:
        plugin.limits = limits
    return plugins
