"""Plugins described by a config file: host device nodes and virtual devices.

config = load_config("devplug.yaml")       # raises ConfigError, one line
plugins = build_plugins(config)            # one Plugin per resource
await devplug.framework.daemon.serve(plugins, plugin_dir)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import msgspec

from devplug.config.errors import ConfigError
from devplug.config.limits import LimitsSpec
from devplug.config.load import load_config, load_default_config, parse_config
from devplug.config.resource import ResourceSpec
from devplug.config.root import Config
from devplug.framework.limits import Limits
from devplug.kube.cdi import default_kind
from devplug.kube.names import label_value, resource_name_problem
from devplug.sources.hostdev import HostDevicePlugin
from devplug.sources.protocol import Source, SourcePlugin
from devplug.sources.sysfs.select import Pool, selected_devices
from devplug.sources.sysfs.tree import Sysfs
from devplug.sources.virtual import VirtualPlugin

log = logging.getLogger("devplug.sources")

__all__ = [
    "Config",
    "ConfigError",
    "HostDevicePlugin",
    "ResourceSpec",
    "Source",
    "SourcePlugin",
    "VirtualPlugin",
    "build_plugin",
    "build_plugins",
    "load_config",
    "load_default_config",
    "parse_config",
    "resource_names",
    "start_problems",
]


def resource_names(config: Config) -> list[str]:
    """The resources a config serves: one per entry, one per model of a split entry
    (without `models`: per value found in sysfs now)."""
    sysfs = Sysfs(config.sysfs_root, config.dev_root)
    names: list[str] = []
    for spec in config.resources:
        if spec.split is None:
            names.append(spec.name)
        else:
            names += [pool_name(spec.name, pool.model) for pool in pools(spec, sysfs)]
    return names


def start_problems(sources: Iterable[Source]) -> list[str]:
    """Why these sources must not be served (one line each; none: fine), e.g. NVML
    failing for an `nvidia:` entry with failOnInitError."""
    return [s.start_problem for s in sources if s.start_problem]


def build_plugin(spec: ResourceSpec, sysfs: Sysfs | None = None) -> SourcePlugin:
    """The plugin of one checked resource (not split into pools)."""
    if spec.virtual is not None:
        return VirtualPlugin(spec)
    return HostDevicePlugin(spec, sysfs)


def build_plugins(
    config: Config, *, sysfs_root: str | None = None, dev_root: str | None = None
) -> list[SourcePlugin]:
    """One plugin per resource of a config returned by `load_config`, one per model for
    a resource with `split`, several for an
    `nvidia:` entry (MIG profiles, models); the roots override the config's
    `sysfsRoot`/`devRoot`."""
    dev_root = dev_root or config.dev_root
    sysfs = Sysfs(sysfs_root or config.sysfs_root, dev_root)
    plugins: list[SourcePlugin] = []
    for spec in config.resources:
        if spec.nvidia is not None:  # NVML loads only here
            from devplug.sources.nvidia.plugin import build_plugins as build_gpu_plugins

            plugins.extend(build_gpu_plugins(spec, dev_root))
            continue
        if spec.split is None:
            plugins.append(build_plugin(spec, sysfs))
            continue
        for pool in pools(spec, sysfs):
            name = pool_name(spec.name, pool.model)
            cdi = spec.cdi
            if cdi is not None and cdi.kind is not None:
                cdi = msgspec.structs.replace(cdi, kind=default_kind(f"{cdi.kind}-{pool.model}"))
            pool_spec = msgspec.structs.replace(spec, name=name, split=None, cdi=cdi)
            plugins.append(HostDevicePlugin(pool_spec, sysfs, pool))
    limits = limits_of(config.limits)
    for plugin in plugins:
        plugin.limits = limits
    return plugins


def limits_of(spec: LimitsSpec) -> Limits:
    """The framework's limits as the config's `limits:` block sets them."""
    return Limits(
        max_request_bytes=spec.max_request_bytes,
        max_devices=spec.max_devices_per_resource,
        max_ids_per_request=spec.max_ids_per_request,
        max_streams=spec.max_streams,
        register_timeout_s=spec.register_timeout_seconds,
    )


def pool_name(resource: str, model: str) -> str:
    """The resource name of one model of a split resource."""
    return f"{resource}-{model}"


def pools(spec: ResourceSpec, sysfs: Sysfs) -> list[Pool]:
    """The models of a split resource: those of `models`, or one per value of the
    attribute among the devices in sysfs now. The kubelet learns a plugin's resource
    when it registers, so a value first seen later is served after a restart."""
    assert spec.split is not None
    assert spec.groups is not None
    by = spec.split.by
    if spec.split.models is not None:
        return [Pool(by, (value,), model) for value, model in spec.split.models.items()]
    found: dict[str, dict[str, None]] = {}
    for group in spec.groups:
        for selected in selected_devices(sysfs, group, None):
            if (value := selected.attributes.get(by)) is not None:
                model = label_value(str(value))
                if resource_name_problem(pool_name(spec.name, model)):
                    log.warning("%s: %s %r gives no valid resource name", spec.name, by, value)
                    continue
                found.setdefault(model, {})[str(value)] = None
    if not found:
        log.warning("%s: no device to split by %s: nothing served", spec.name, by)
    return [Pool(by, tuple(values), model) for model, values in sorted(found.items())]
