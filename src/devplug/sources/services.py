"""The daemon services a config asks for: the node feature file and CDI spec files."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from devplug.framework.daemon import Service
from devplug.sources.config import Config
from devplug.sources.hostdev import HostDevicePlugin

if TYPE_CHECKING:
    from devplug.sources import SourcePlugin


def build_services(
    config: Config,
    plugins: Sequence[SourcePlugin],
    *,
    feature_file: str | None = None,
) -> list[Service]:
    """A `FeatureFile` when the config has `nodeFeatures` or `feature_file` is given,
    and a `CdiSpecs` per folder of the resources whose `cdi` writes a spec."""
    services: list[Service] = []
    path = feature_file or (config.node_features.path if config.node_features else None)
    if path:
        from devplug.outputs.nfd import FeatureFile

        services.append(FeatureFile(path))
    folders: dict[str, dict[str, str]] = {}
    for plugin in plugins:
        cdi = plugin.spec.cdi
        if isinstance(plugin, HostDevicePlugin) and cdi is not None and cdi.write_spec:
            folders.setdefault(cdi.dir, {})[plugin.resource_name] = plugin.cdi_kind
    if folders:
        from devplug.outputs.cdi import CdiSpecs

        services += [CdiSpecs(kinds, folder) for folder, kinds in folders.items()]
    return services
