"""The root of the config file: its `resources`, the sysfs and /dev roots, node
features and events, and `limits`; the checks across the whole file, and the modes
a node's labels give its resources."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NoReturn

import msgspec

from devplug.config import hardware
from devplug.config.dra import MODES, served_twice
from devplug.config.errors import ConfigError, one_line
from devplug.config.limits import LimitsSpec, check_limits
from devplug.config.resource import ResourceSpec, check_resources


class _Schema(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    pass


class Config(_Schema):
    resources: list[ResourceSpec]
    sysfs_root: str = hardware.DEFAULT_SYSFS_ROOT
    dev_root: str = hardware.DEFAULT_DEV_ROOT
    node_features: hardware.NodeFeaturesSpec | None = None
    # A Kubernetes Event on the Node for each change of a device's health.
    node_events: bool = False
    limits: LimitsSpec = msgspec.field(default_factory=LimitsSpec)


def check_config(config: Config, source: str) -> None:
    def fail(field: str, problem: str) -> NoReturn:
        raise ConfigError(f"{source}: {field}: {one_line(problem)}")

    check_limits(config.limits, fail)
    if not config.resources:
        fail("resources", "expected at least one resource")
    for field, value in (("sysfsRoot", config.sysfs_root), ("devRoot", config.dev_root)):
        if not value.startswith("/"):
            fail(field, f"expected an absolute path, got {value!r}")
    if config.node_features is not None and not config.node_features.path.startswith("/"):
        fail("nodeFeatures.path", f"expected an absolute path, got {config.node_features.path!r}")
    check_resources(config.resources, config.limits, fail)
    check_served_once(config, source)


def check_served_once(config: Config, source: str) -> None:
    """No name served on a node both as a device plugin and through DRA (the modes
    as they are: the config's, or a node's once its labels applied them)."""
    entries = [(r.name, r.mode, r.dra) for r in config.resources]
    if found := served_twice(entries):
        index, problem = found
        raise ConfigError(f"{source}: resources[{index}].mode: {problem}")


def needs_node_labels(config: Config) -> bool:
    return any(r.node_mode_label is not None for r in config.resources)


def apply_node_modes(config: Config, labels: Mapping[str, str], node: str, source: str) -> None:
    """Give each resource with `nodeModeLabel` the mode that label says on `node` (its
    `mode` where the node lacks the label); ConfigError for a value that is no mode,
    or modes that would serve a name both ways."""
    for i, resource in enumerate(config.resources):
        key = resource.node_mode_label
        if key is None or key not in labels:
            continue
        value = labels[key]
        if value not in MODES:
            raise ConfigError(
                f"{source}: resources[{i}].nodeModeLabel: node {node} has {key}={value!r}, "
                f"expected one of {', '.join(MODES)}"
            )
        resource.mode = value  # type: ignore[assignment]  # checked against MODES
    check_served_once(config, f"{source} (modes of node {node})")
