"""The plugins of one pool, built once and shared by every node of the pool.

A pool's nodes are identical machines, so one set of plugin objects serves them all:
a plugin holds the device list and the hooks, while what each node has handed out
lives in that node's device manager. GPU pools get a fake NVML host of their own (the
`gpus` of the fleet file, or a fake NVML description), read once while the pool is
built; nothing polls NVML afterwards (the fleet's devices stay healthy).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from devplug.config.dra import plugin_driver_name, serves_device_plugin, serves_dra
from devplug.config.root import Config
from devplug.fleet.shares import PoolPlacements
from devplug.fleet.spec import GpuHostSpec, Pool, gpu_description
from devplug.framework.device import Attribute
from devplug.framework.dra.driver import DriverBinding
from devplug.sources import SourcePlugin, build_plugins

log = logging.getLogger("devplug.fleet")

_NVML_ENV = ("DEVPLUG_NVML_MODULE", "DEVPLUG_FAKE_NVML")


@dataclass
class PoolHardware:
    """What every node of a pool serves."""

    pool: Pool
    # Served through the device plugin API (counted in the Node's capacity).
    device_plugins: list[SourcePlugin] = field(default_factory=list)
    # Served through DRA (published in ResourceSlices, prepared per claim).
    drivers: list[DriverBinding] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    # A GPU resource served with `replicaPolicy: extender`: published on each Node for
    # the scheduler extender, and told which pod each request is for.
    placements: PoolPlacements | None = None

    def capacity(self) -> dict[str, int]:
        """Devices per device-plugin resource, all of them."""
        return {p.resource_name: len(p.devices) for p in self.device_plugins}

    def allocatable(self) -> dict[str, int]:
        """Healthy devices per device-plugin resource."""
        return {
            p.resource_name: sum(d.healthy for d in p.devices.values()) for p in self.device_plugins
        }


@contextlib.contextmanager
def _fake_nvml(folder: Path, spec: GpuHostSpec) -> Iterator[str]:
    """Point NVML at the pool's fake host while its plugins are built; yields the
    host root (its /dev and /sys) for the config's `hostRoot`."""
    from devplug.fakes.gpus import FakeGpuHost

    host = FakeGpuHost(folder, gpu_description(spec))
    saved = {key: os.environ.get(key) for key in _NVML_ENV}
    os.environ.update(host.env)
    try:
        yield host.host_root
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def build_pool(pool: Pool, folder: Path) -> PoolHardware:
    """Build and publish the pool's plugins (GPU pools: their fake host in `folder`)."""
    config = pool.config
    with contextlib.ExitStack() as stack:
        if pool.spec.gpus is not None:
            root = stack.enter_context(_fake_nvml(folder / pool.name / "gpus", pool.spec.gpus))
            config = _with_host_root(config, root)
        plugins = build_plugins(config)
        for plugin in plugins:
            plugin.publish(plugin.discover())
            for warning in plugin.warnings:
                log.warning("pool %s: %s", pool.name, warning)
        placements = _placements(plugins)
        if pool.spec.gpus is not None:  # read once: nothing polls the pool's NVML later
            from devplug.sources.nvidia.plugin import NvidiaPlugin

            for source in {
                id(p.source): p.source for p in plugins if isinstance(p, NvidiaPlugin)
            }.values():
                source.release()
    hardware = PoolHardware(pool, placements=placements)
    for plugin in plugins:
        if serves_device_plugin(plugin.spec.mode):
            hardware.device_plugins.append(plugin)
        if serves_dra(plugin.spec.mode):
            hardware.drivers.append(config_driver(plugin))
        hardware.labels.update(plugin.node_labels())
    return hardware


def _placements(plugins: list[SourcePlugin]) -> PoolPlacements | None:
    """The pool's shares for the extender: the first plugin served with `replicaPolicy:
    extender` (one per node is published, as `devplug serve` does)."""
    from devplug.sources.nvidia.extender import inventory, uses_extender
    from devplug.sources.nvidia.plugin import NvidiaPlugin

    for plugin in plugins:
        if isinstance(plugin, NvidiaPlugin) and uses_extender(plugin):
            placements = PoolPlacements(inventory(plugin))
            plugin.placements = placements
            return placements
    return None


def config_driver(plugin: SourcePlugin) -> DriverBinding:
    """The DRA driver of a config-built plugin, named and described as its config says."""
    dra = plugin.spec.dra
    attributes: dict[str, Attribute] = dict(dra.attributes) if dra else {}
    return DriverBinding(
        plugin,
        plugin_driver_name(plugin.resource_name, plugin.spec.name, dra),
        attributes,
        dict(dra.attribute_names) if dra else {},
    )


def _with_host_root(config: Config, root: str) -> Config:
    resources = [
        msgspec.structs.replace(r, nvidia=msgspec.structs.replace(r.nvidia, host_root=root))
        if r.nvidia is not None
        else r
        for r in config.resources
    ]
    return msgspec.structs.replace(config, resources=resources)
