"""The daemon services a config asks for: the node feature file and CDI spec files."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from devplug.config.root import Config
from devplug.framework.daemon import Service
from devplug.outputs.cdi import CdiSpecs, WritesCdiSpec
from devplug.sources.hostdev import HostDevicePlugin

if TYPE_CHECKING:
    from devplug.framework.plugin import Plugin
    from devplug.outputs.nfd import FeatureFile


def build_services(config: Config, *, feature_file: str | None = None) -> list[Service]:
    """The `FeatureFile` (at `feature_file`, else at the config's `nodeFeatures` path, else
    nowhere until a reload names one) and the `CdiSpecs` writer. Both follow the served
    plugins, so a config reload that adds, removes or changes resources changes their
    labels and specs; the writer is there even when no resource writes a spec yet, for
    a reload that adds one."""
    from devplug.outputs.nfd import FeatureFile

    return [FeatureFile(feature_file or feature_path(config)), CdiSpecs(cdi_place)]


def feature_path(config: Config) -> str | None:
    return config.node_features.path if config.node_features else None


def config_followers(
    services: Sequence[Service], *, feature_file: str | None = None
) -> list[Callable[[Config], None]]:
    """What a config reload tells each applied config: the feature file follows the
    config's `nodeFeatures` (unless `--feature-file` fixed its path)."""
    from devplug.outputs.nfd import FeatureFile

    if feature_file:
        return []
    return [_feature_follower(s) for s in services if isinstance(s, FeatureFile)]


def _feature_follower(file: FeatureFile) -> Callable[[Config], None]:
    return lambda config: file.move(feature_path(config))


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
