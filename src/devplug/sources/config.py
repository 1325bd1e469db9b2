"""The config file of the config-driven plugins: schema, loading, one-line errors, ID rules.

The schema is checked in two passes: msgspec checks the shape (types, required and
unknown keys), then `_check` the meaning (names, paths, limits). Either way a bad file
gives one `ConfigError` whose message names the file, the field and the problem:
`config.yaml: resources[0].count: expected an integer >= 1, got 0`.
"""

from __future__ import annotations

import glob
import os
import posixpath
import re
from collections.abc import Callable, Mapping
from typing import NoReturn, TypeVar

import msgspec

from devplug.config.ids import REPLICA_SEPARATOR, device_id_problem, path_device_id
from devplug.ground import inputs
from devplug.ground.trust import write_problem
from devplug.kube.cdi import cdi_name_problem, default_kind, kind_problem
from devplug.kube.containers import env_problem, permissions_problem
from devplug.kube.names import label_name_problem, resource_name_problem
from devplug.sources import hardware
from devplug.sources.draconfig import (
    MODES,
    DraSpec,
    Mode,
    check_attributes,
    check_dra,
    check_node_work,
    driver_name,
    served_twice,
    serves_dra,
)
from devplug.sources.limits import LimitsSpec, check_limits
from devplug.sources.nvidia.config import DEFAULT_RESOURCE as NVIDIA_RESOURCE
from devplug.sources.nvidia.config import NvidiaSpec, check_nvidia

MAX_COUNT = 1000
MAX_VIRTUAL = 10_000
DEFAULT_CONFIG = "default.yaml"
_T = TypeVar("_T")


class ConfigError(Exception):
    """A config file that cannot be used; the message is one line."""


class _Schema(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    pass


class PathSpec(_Schema):
    path: str
    permissions: str = "rw"
    # Ending in '/': a folder, where the node keeps its own name (allowed on a glob).
    container_path: str = ""
    # A node the device is served without while it is missing (left out of Allocate).
    optional: bool = False


class MountSpec(_Schema):
    host_path: str
    container_path: str = ""
    read_only: bool = False
    # required: the device is Unhealthy while host_path is missing; optional: the mount
    # is left out while it is missing; neither: mounted as it is.
    required: bool = False
    optional: bool = False


class GroupSpec(_Schema):
    # Required unless the group has a `usb` or `pci` selector.
    paths: list[PathSpec] = []
    # The device's ID instead of one derived from its first path (groups with no glob).
    id: str | None = None
    mounts: list[MountSpec] = []
    env: dict[str, str] = {}
    annotations: dict[str, str] = {}
    cdi_devices: list[str] = []
    numa_node: int | None = None
    # Devices selected by what they are, read in sysfs (sources/hardware.py).
    usb: hardware.UsbSelector | None = None
    pci: hardware.PciSelector | None = None
    # What the devices are (model, vendor...): node labels, pools, DRA attributes.
    attributes: dict[str, str | int | bool] = {}
    # Replicas of each device of this group (default: the resource's count).
    count: int | None = None


class ResourceSpec(_Schema):
    # Required, except with `nvidia` (default nvidia.com/gpu).
    name: str = ""
    count: int = 1
    allow_any_path: bool = False
    preferred_allocation: bool = True
    groups: list[GroupSpec] | None = None
    virtual: int | None = None
    preferred: str = "numa"
    health: hardware.HealthSpec | None = None
    cdi: hardware.CdiSpec | None = None
    split: hardware.SplitSpec | None = None
    # How the resource is served: as a device plugin, a DRA driver, or both.
    mode: Mode = "devicePlugin"
    # A node label whose value (devicePlugin, dra or both) is the mode on that node,
    # so that a cluster moves from counted to described node by node.
    node_mode_label: str | None = None
    dra: DraSpec | None = None
    # NVIDIA GPUs through NVML (devplug.sources.nvidia).
    nvidia: NvidiaSpec | None = None


class Config(_Schema):
    resources: list[ResourceSpec]
    sysfs_root: str = hardware.DEFAULT_SYSFS_ROOT
    dev_root: str = hardware.DEFAULT_DEV_ROOT
    node_features: hardware.NodeFeaturesSpec | None = None
    # A Kubernetes Event on the Node for each change of a device's health.
    node_events: bool = False
    limits: LimitsSpec = msgspec.field(default_factory=LimitsSpec)


# -- loading ---------------------------------------------------------------------------


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and check a config file; raise ConfigError with a one-line message."""
    source = os.fspath(path)
    check_trusted(source)
    try:
        text = inputs.read_text(source, what="the config")
    except inputs.InputError as e:
        raise ConfigError(str(e)) from None
    return parse_config(text, source)


def check_trusted(path: str | os.PathLike[str]) -> None:
    """ConfigError unless only root and its owner can change the config at `path`: it
    decides which programs devplug runs and what containers get (devplug.ground.trust)."""
    if problem := write_problem(path):
        raise ConfigError(f"{os.fspath(path)}: refused: {problem}")


def load_default_config() -> Config:
    """The config packaged with devplug (virtual resources and /dev/null-style nodes)."""
    beside = os.path.join(os.path.dirname(__file__), DEFAULT_CONFIG)
    try:  # an installed package: a plain file beside this module (no importlib.resources)
        with open(beside, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:  # a zipped package
        from importlib import resources as package_files

        text = package_files.files("devplug.sources").joinpath(DEFAULT_CONFIG).read_text("utf-8")
    return parse_config(text, f"<packaged {DEFAULT_CONFIG}>")


def parse_config(text: str, source: str = "<config>") -> Config:
    """Check config text; `source` names it in error messages."""
    try:
        data = inputs.load_yaml(text, source)
    except inputs.InputError as e:
        raise ConfigError(str(e)) from None
    if data is None:
        raise ConfigError(f"{source}: the config is empty: expected a mapping with 'resources'")
    return config_from_data(data, source)


def config_from_data(data: object, source: str) -> Config:
    """Check config data (parsed YAML, or what a front translated from another tool's
    flags and files); `source` names it in error messages."""
    config = convert(data, Config, source)
    _check(config, source)
    return config


def convert(data: object, schema: type[_T], source: str) -> _T:
    """`data` (parsed YAML) as a `schema` struct, or a ConfigError naming the file,
    the field and the problem: the shape check of every devplug file."""
    try:
        return msgspec.convert(data, schema)
    except msgspec.ValidationError as e:
        raise ConfigError(_shape_message(source, str(e))) from None


def _one_line(text: str) -> str:
    return " ".join(text.split())


# msgspec's type names, as a config author would say them.
_TYPES = {
    "object": "a mapping",
    "array": "a list",
    "array | null": "a list",
    "str": "a string",
    "int": "an integer",
    "int | null": "an integer",
    "bool": "true or false",
    "float": "a number",
    "null": "nothing (null)",
    "str | array | null": 'a string or a list (quote hex IDs: "0403")',
}
_AT = re.compile(r"^(?P<problem>.*) - at `(?P<path>[^`]*)`$", re.DOTALL)
_AT_KEY = re.compile(r"^(?P<problem>.*) - at `key` in `(?P<path>[^`]*)`$", re.DOTALL)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<field>.*)`$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<field>.*)`$", re.DOTALL)
_EXPECTED = re.compile(r"^Expected `(?P<want>[^`]*)`(?:, got `(?P<got>[^`]*)`)?$")


def _shape_message(source: str, message: str) -> str:
    """msgspec's 'Expected `int`, got `str` - at `$.resources[0].count`' -> 'FILE:
    resources[0].count: expected an integer, got a string'."""
    key_problem = False
    if m := _AT_KEY.match(message):
        key_problem = True
    else:
        m = _AT.match(message)
    problem, path = (m["problem"], m["path"]) if m else (message, "$")
    path = path.removeprefix("$").removeprefix(".")
    if m := _UNKNOWN.match(problem):
        field = m["field"]
        if not field.isprintable() or not field.strip():
            field = repr(field)  # a key of newlines or control characters, shown as such
        path, problem = _join(path, field), "unknown key"
    elif m := _MISSING.match(problem):
        path, problem = _join(path, m["field"]), "required key is missing"
    elif m := _EXPECTED.match(problem):
        want, got = m["want"], m["got"]
        problem = f"expected {_TYPES.get(want, want)}"
        if got:
            problem += f", got {_TYPES.get(got, got)}"
        if key_problem:
            problem = f"keys must be strings: {problem}"
        if not path and want == "object":
            problem += " (the config must be a mapping with 'resources')"
    path = _one_line(path.replace("[...]", "[*]"))
    return f"{source}: {path}: {_one_line(problem)}" if path else f"{source}: {_one_line(problem)}"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# -- meaning ------------------------------------------------------------------------------


def _check(config: Config, source: str) -> None:
    def fail(field: str, problem: str) -> NoReturn:
        raise ConfigError(f"{source}: {field}: {_one_line(problem)}")

    check_limits(config.limits, fail)
    if not config.resources:
        fail("resources", "expected at least one resource")
    for field, value in (("sysfsRoot", config.sysfs_root), ("devRoot", config.dev_root)):
        if not value.startswith("/"):
            fail(field, f"expected an absolute path, got {value!r}")
    if config.node_features is not None and not config.node_features.path.startswith("/"):
        fail("nodeFeatures.path", f"expected an absolute path, got {config.node_features.path!r}")
    seen: dict[str, int] = {}
    kinds: dict[str, str] = {}
    drivers: dict[str, str] = {}
    for i, resource in enumerate(config.resources):
        at = f"resources[{i}]"
        if not resource.name and resource.nvidia is not None:
            resource.name = NVIDIA_RESOURCE
        if not resource.name:
            fail(f"{at}.name", "required key is missing")
        if resource.node_mode_label is not None and (
            problem := label_name_problem(resource.node_mode_label)
        ):
            fail(f"{at}.nodeModeLabel", problem)
        extended = resource.dra.extended_resource_name if resource.dra else None
        if extended and (problem := resource_name_problem(extended)):
            fail(f"{at}.dra.extendedResourceName", problem)
        for kind in _cdi_kinds(resource):
            if kind in kinds:
                fail(f"{at}.cdi.kind", f"CDI kind {kind!r} is already the kind of {kinds[kind]}")
            kinds[kind] = at
        if problem := resource_name_problem(resource.name):
            fail(f"{at}.name", problem)
        if resource.name in seen:
            fail(
                f"{at}.name",
                f"duplicate resource {resource.name!r}, see resources[{seen[resource.name]}]",
            )
        seen[resource.name] = i
        for model in (resource.split.models or {}).values() if resource.split else ():
            pool = f"{resource.name}-{model}"
            if pool in seen:
                fail(f"{at}.split.models", f"resource {pool!r} is already served")
            seen[pool] = i
        if problem := _int_problem(resource.count, 1, MAX_COUNT):
            fail(f"{at}.count", problem)
        if resource.dra is not None:
            nvidia = resource.nvidia is not None
            check_dra(
                resource.dra,
                f"{at}.dra",
                fail,
                mode=resource.mode,
                count=resource.nvidia.replicas if resource.nvidia else resource.count,
                nvidia=nvidia,
            )
            check_node_work(resource, f"{at}.dra", fail)
        if resource.nvidia is not None:
            if resource.groups is not None or resource.virtual is not None:
                fail(at, "'nvidia' is set with 'groups' or 'virtual': a resource has one of them")
            if resource.count != 1:
                fail(f"{at}.count", "not used with 'nvidia': set nvidia.replicas to share GPUs")
            for key in ("health", "cdi", "split"):
                if getattr(resource, key) is not None:
                    fail(f"{at}.{key}", "not used with 'nvidia' (see the nvidia block's options)")
            check_nvidia(resource.nvidia, resource.name, at, fail)
            continue
        if resource.groups is not None and resource.virtual is not None:
            fail(at, "both 'groups' and 'virtual' are set: a resource has exactly one of them")
        if resource.groups is None and resource.virtual is None:
            fail(at, "neither 'groups' nor 'virtual' nor 'nvidia' is set: a resource needs one")
        if serves_dra(resource.mode):
            if resource.split is not None and resource.dra and resource.dra.driver:
                fail(
                    f"{at}.dra.driver",
                    "not allowed with 'split': each model's pool is a driver of its own, "
                    "named after its resource ('<resource>-<model>')",
                )
            driver = driver_name(resource.name, resource.dra)
            if driver in drivers:
                fail(f"{at}.dra.driver", f"driver {driver!r} already serves {drivers[driver]}")
            drivers[driver] = at
        if resource.virtual is not None:
            if problem := _int_problem(resource.virtual, 1, MAX_VIRTUAL):
                fail(f"{at}.virtual", problem)
            _check_device_count(resource.virtual * resource.count, at, config.limits, fail)
            continue
        if resource.groups is None:  # for the type checker: `virtual` handled above
            continue
        if not resource.groups:
            fail(f"{at}.groups", "expected at least one group")
        _check_hardware(resource, at, fail)
        ids: dict[str, str] = {}
        reserved_env = framework_env(resource)
        known = 0  # devices known from the config alone, replicas included
        for j, group in enumerate(resource.groups):
            _check_group(group, f"{at}.groups[{j}]", resource.allow_any_path, reserved_env, fail)
            if group.count is not None and serves_dra(resource.mode):
                fail(f"{at}.groups[{j}].count", "not used with mode dra or both: set count")
            if is_selector(group):
                continue
            if not any(has_glob(p.path) for p in group.paths):
                device_id = group_device_id(group)
                if device_id in ids:
                    field = "id" if group.id is not None else "paths[0].path"
                    fail(
                        f"{at}.groups[{j}].{field}",
                        f"device ID {device_id!r} is already the ID of {ids[device_id]}",
                    )
                ids[device_id] = f"{at}.groups[{j}]"
                known += group.count or resource.count
        _check_device_count(known, at, config.limits, fail)
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


def _check_device_count(total: int, at: str, limits: LimitsSpec, fail: _Fail) -> None:
    """Devices known from the config alone (glob matches are bounded when served)."""
    if total > limits.max_devices_per_resource:
        fail(
            at,
            f"{total} devices (replicas included), more than "
            f"limits.maxDevicesPerResource ({limits.max_devices_per_resource})",
        )


def is_selector(group: GroupSpec) -> bool:
    """Whether the group selects devices in sysfs (its paths then join each device)."""
    return group.usb is not None or group.pci is not None


def _cdi_kinds(resource: ResourceSpec) -> list[str]:
    """The CDI kinds a resource writes specs for (one per model when split)."""
    if resource.cdi is None or not resource.cdi.write_spec:
        return []
    kind = resource.cdi.kind or resource.name
    if resource.split is None:
        return [default_kind(kind)]
    # Without `models`, the kinds depend on the devices found at start.
    return [default_kind(f"{kind}-{model}") for model in (resource.split.models or {}).values()]


def _check_hardware(resource: ResourceSpec, at: str, fail: _Fail) -> None:
    groups = resource.groups or []
    if resource.preferred not in hardware.POLICIES:
        fail(
            f"{at}.preferred",
            f"expected one of {', '.join(hardware.POLICIES)}, got {resource.preferred!r}",
        )
    if resource.health is not None:
        selector = bool(groups) and all(is_selector(g) for g in groups)
        hardware.check_health(resource.health, f"{at}.health", selector, fail)
    if resource.cdi is not None:
        hardware.check_cdi(resource.cdi, f"{at}.cdi", fail)
        if resource.cdi.kind is None and (problem := kind_problem(default_kind(resource.name))):
            fail(f"{at}.cdi.kind", f"needed: the resource name gives no valid kind: {problem}")
    if resource.split is not None:
        if not all(is_selector(g) for g in groups):
            fail(f"{at}.split", "needs every group to have a 'usb' or 'pci' selector")
        selectors = [(g.usb, g.pci) for g in groups]
        hardware.check_split(resource.split, f"{at}.split", selectors, fail)
        for model in (resource.split.models or {}).values():
            if problem := resource_name_problem(f"{resource.name}-{model}"):
                fail(f"{at}.split.models", problem)


def _check_group(
    group: GroupSpec,
    at: str,
    allow_any_path: bool,
    reserved_env: Mapping[str, str],
    fail: _Fail,
) -> None:
    if group.usb is not None and group.pci is not None:
        fail(at, "both 'usb' and 'pci' are set: a group selects one kind of device")
    if group.usb is not None:
        hardware.check_usb(group.usb, f"{at}.usb", fail)
    if group.pci is not None:
        hardware.check_pci(group.pci, f"{at}.pci", fail)
    if not group.paths and not is_selector(group) and not required_mounts(group):
        fail(
            f"{at}.paths",
            "expected at least one path (or a 'usb' or 'pci' selector, or a required mount)",
        )
    if is_selector(group):
        if group.id is not None:
            fail(f"{at}.id", "not allowed with a selector: each selected device has its own ID")
        for k, spec in enumerate(group.paths):
            if has_glob(spec.path):
                fail(f"{at}.paths[{k}].path", "no glob with a selector: use {placeholders}")
            hardware.check_placeholders(spec.path, f"{at}.paths[{k}].path", fail)
    if group.id is not None:
        if any(has_glob(p.path) for p in group.paths):
            fail(f"{at}.id", "not allowed with a glob path: each match is a device of its own")
        if problem := device_id_problem(group.id):
            fail(f"{at}.id", problem)
        if REPLICA_SEPARATOR in group.id:
            fail(
                f"{at}.id",
                f"{group.id!r} contains {REPLICA_SEPARATOR!r}, the separator of shared replicas",
            )
    for k, spec in enumerate(group.paths):
        where = f"{at}.paths[{k}]"
        if problem := _host_path_problem(spec.path, allow_any_path):
            fail(f"{where}.path", problem)
        if problem := permissions_problem(spec.permissions):
            fail(f"{where}.permissions", problem)
        if spec.container_path:
            if problem := path_problem(spec.container_path):
                fail(f"{where}.containerPath", problem)
            if has_glob(spec.path) and not spec.container_path.endswith("/"):
                fail(
                    f"{where}.containerPath",
                    "not allowed on a glob path unless it is a folder (ending in '/'): "
                    "every match would get the same container path",
                )
    for k, mount in enumerate(group.mounts):
        where = f"{at}.mounts[{k}]"
        if problem := path_problem(mount.host_path):
            fail(f"{where}.hostPath", problem)
        if has_glob(mount.host_path):
            fail(f"{where}.hostPath", "a mount names one path: globs are not expanded here")
        if mount.container_path and (problem := path_problem(mount.container_path)):
            fail(f"{where}.containerPath", problem)
        if mount.required and mount.optional:
            fail(where, "both 'required' and 'optional' are set: a mount is one or the other")
    if group.count is not None and (problem := _int_problem(group.count, 1, MAX_COUNT)):
        fail(f"{at}.count", problem)
    for key, value in group.env.items():
        if problem := env_problem(key, value):
            fail(f"{at}.env", problem)
        if key in reserved_env:
            fail(f"{at}.env.{key}", f"set by devplug to {reserved_env[key]}: use another name")
    for k, name in enumerate(group.cdi_devices):
        if problem := cdi_name_problem(name):
            fail(f"{at}.cdiDevices[{k}]", problem)
    if group.numa_node is not None and group.numa_node < 0:
        fail(f"{at}.numaNode", f"expected an integer >= 0, got {group.numa_node}")
    check_attributes(group.attributes, f"{at}.attributes", fail)


_Fail = Callable[[str, str], NoReturn]


def _int_problem(value: int, low: int, high: int) -> str | None:
    if value < low:
        return f"expected an integer >= {low}, got {value}"
    if value > high:
        return f"expected an integer <= {high}, got {value}"
    return None


def path_problem(path: str) -> str | None:
    """Why `path` cannot name a file of the host or container: it must be absolute,
    without NUL and without '..' (no climbing out of the folder it names)."""
    if not path.startswith("/"):
        return f"expected an absolute path, got {path!r}"
    if "\0" in path:
        return "the path contains a NUL character"
    if ".." in path.split("/"):
        return f"{path!r} contains '..': name the folder directly"
    return None


def _host_path_problem(path: str, allow_any_path: bool) -> str | None:
    if problem := path_problem(path):
        return problem
    if not allow_any_path and not posixpath.normpath(path).startswith("/dev/"):
        return f"{path!r} is outside /dev (set 'allowAnyPath: true' on the resource to allow it)"
    return None


# -- device IDs and names ------------------------------------------------------------------


def has_glob(path: str) -> bool:
    return glob.has_magic(path)


_ENV_UNSAFE = re.compile(r"[^A-Za-z0-9]")


def group_device_id(group: GroupSpec) -> str:
    """The ID of a group with no glob: its `id`, or one derived from its first path (or
    required mount)."""
    if group.id is not None:
        return group.id
    return path_device_id(group.paths[0].path if group.paths else required_mounts(group)[0])


def required_mounts(group: GroupSpec) -> list[str]:
    """The host paths of the mounts a group's devices need (Unhealthy while missing)."""
    return [m.host_path for m in group.mounts if m.required]


def ids_env_name(resource_name: str) -> str:
    """'example.com/kvm' -> 'DEVPLUG_EXAMPLE_COM_KVM'."""
    return "DEVPLUG_" + _ENV_UNSAFE.sub("_", resource_name).upper()


def pci_resource_env(resource_name: str) -> str:
    """KubeVirt's variable for the PCI addresses of a resource:
    'example.com/fpga-u280' -> 'PCI_RESOURCE_EXAMPLE_COM_FPGA-U280'."""
    return "PCI_RESOURCE_" + resource_name.upper().replace("/", "_").replace(".", "_")


def framework_env(resource: ResourceSpec) -> dict[str, str]:
    """The variables devplug itself sets in a container of `resource` at Allocate (name
    -> what), which a group's `env` must not name: the allocated IDs, and for PCI groups
    KubeVirt's list of addresses (per model pool of a split resource too)."""
    names = [resource.name]
    if resource.split is not None:
        names += [f"{resource.name}-{m}" for m in (resource.split.models or {}).values()]
    found = {ids_env_name(n): "the allocated device IDs" for n in names}
    if any(g.pci is not None for g in resource.groups or ()):
        found |= {pci_resource_env(n): "the allocated PCI addresses" for n in names}
    return found
