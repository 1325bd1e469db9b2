"""Plugins described by a config file: host device nodes and virtual devices.

config = load_config("devplug.yaml")       # raises ConfigError, one line
plugins = build_plugins(config)            # one Plugin per resource
await devplug.framework.daemon.serve(plugins, plugin_dir)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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

# Every kind offers `discover()` (the devices to serve now, without publishing) and
# `warnings` (one-line messages, e.g. a glob that matches nothing).
if TYPE_CHECKING:
    from devplug.sources.nvidia.plugin import NvidiaPlugin

    SourcePlugin = HostDevicePlugin | VirtualPlugin | NvidiaPlugin
else:
    SourcePlugin = HostDevicePlugin | VirtualPlugin  # NVIDIA's loads only when configured

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
    """One plugin per resource of a config returned by `load_config` (an `nvidia:` entry
    can give several: MIG profiles, per-model names)."""
    plugins: list[SourcePlugin] = []
    for spec in config.resources:
        if spec.nvidia is not None:
            from devplug.sources.nvidia.plugin import build_plugins as build_gpu_plugins

            plugins.extend(build_gpu_plugins(spec))
        else:
            plugins.append(build_plugin(spec))
    return plugins
