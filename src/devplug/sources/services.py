"""The daemon services a config asks for: the node feature file and CDI spec files."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from devplug.framework.daemon import Service
from devplug.outputs.cdi import CdiSpecs, WritesCdiSpec
from devplug.sources.config import Config
from devplug.sources.hostdev import HostDevicePlugin

if TYPE_CHECKING:
    from devplug.framework.plugin import Plugin


def build_services(config: Config, *, feature_file: str | None = None) -> list[Service]:
    """A `FeatureFile` when the config has `nodeFeatures` or `feature_file` is given (its
    path is the one at start), and the `CdiSpecs` writer. Both follow the served
    plugins, so a config reload that adds, removes or changes resources changes their
    labels and specs; the writer is there even when no resource writes a spec yet, for
    a reload that adds one."""
    services: list[Service] = []
    path = feature_file or (config.node_features.path if config.node_features else None)
    if path:
        from devplug.outputs.nfd import FeatureFile

        services.append(FeatureFile(path))
    services.append(CdiSpecs(cdi_place))
    return services


def cdi_place(plugin: Plugin) -> tuple[str, Path] | None:
    """The CDI kind and folder of a resource whose `cdi` writes a spec (or of a plugin
    that places its spec itself), else None."""
    if isinstance(plugin, WritesCdiSpec):
        return plugin.cdi_spec_place()
    if not isinstance(plugin, HostDevicePlugin):
        return None
    cdi = plugin.spec.cdi
    if cdi is None or not cdi.write_spec:
        return None
    return plugin.cdi_kind, Path(cdi.dir)
