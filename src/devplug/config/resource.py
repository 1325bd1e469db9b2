"""The `resources:` list: one entry per resource, its schema and meaning checks, those
across entries too (one name, one CDI kind and one DRA driver each). An entry takes its
devices from `groups`, `virtual` or `nvidia`, each a block of its own module
(devplug.config.groups, devplug.config.nvidia), as are `health`, `cdi` and `split`
(devplug.config.hardware), `dra` (devplug.config.dra) and `limits`."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from devplug.config import hardware
from devplug.config.dra import (
    DraSpec,
    Mode,
    check_dra,
    driver_name,
    serves_dra,
)
from devplug.config.errors import Fail, int_problem
from devplug.config.groups import (
    MAX_COUNT,
    GroupSpec,
    check_group,
    group_device_id,
    has_glob,
    is_selector,
)
from devplug.config.ids import ids_env_name, pci_resource_env
from devplug.config.limits import LimitsSpec
from devplug.config.nvidia import DEFAULT_RESOURCE as NVIDIA_RESOURCE
from devplug.config.nvidia import NvidiaSpec
from devplug.config.nvidiacheck import check_nvidia
from devplug.kube.cdi import default_kind, kind_problem
from devplug.kube.names import label_name_problem, resource_name_problem

MAX_VIRTUAL = 10_000


class _Schema(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    pass


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


def check_resources(resources: Sequence[ResourceSpec], limits: LimitsSpec, fail: Fail) -> None:
    """Meaning checks of every entry, and across entries; an `nvidia` entry without a
    name gets its default here."""
    seen: dict[str, int] = {}
    kinds: dict[str, str] = {}
    drivers: dict[str, str] = {}
    for i, resource in enumerate(resources):
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
        for kind in cdi_kinds(resource):
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
        if problem := int_problem(resource.count, 1, MAX_COUNT):
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
            if problem := int_problem(resource.virtual, 1, MAX_VIRTUAL):
                fail(f"{at}.virtual", problem)
            _check_device_count(resource.virtual * resource.count, at, limits, fail)
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
            check_group(group, f"{at}.groups[{j}]", resource.allow_any_path, reserved_env, fail)
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
        _check_device_count(known, at, limits, fail)


def check_node_work(resource: ResourceSpec, at: str, fail: Fail) -> None:
    """`skipNodeOperations` only where a claim's containers get nothing from the node:
    with it, a kubelet that skips the calls hands them no device node, mount, env or
    CDI device of devplug's."""
    spec = resource.dra
    if spec is None or not spec.skip_node_operations:
        return
    at = f"{at}.skipNodeOperations"
    if spec.partitions is not None or spec.consumable_capacity:
        fail(at, "not with 'partitions' or 'consumableCapacity': their claims are prepared")
    if resource.nvidia is not None or resource.cdi is not None:
        fail(at, "not for GPUs or CDI devices: their containers need the devices on the node")
    for k, group in enumerate(resource.groups or []):
        gives = [
            key
            for key, value in (
                ("paths", group.paths),
                ("mounts", group.mounts),
                ("env", group.env),
                ("annotations", group.annotations),
                ("cdiDevices", group.cdi_devices),
                ("usb", group.usb),
                ("pci", group.pci),
            )
            if value
        ]
        if gives:
            fail(
                at,
                f"groups[{k}] gives containers {', '.join(gives)}: a device that needs "
                "nothing on the node has none of them",
            )


def _check_device_count(total: int, at: str, limits: LimitsSpec, fail: Fail) -> None:
    """Devices known from the config alone (glob matches are bounded when served)."""
    if total > limits.max_devices_per_resource:
        fail(
            at,
            f"{total} devices (replicas included), more than "
            f"limits.maxDevicesPerResource ({limits.max_devices_per_resource})",
        )


def cdi_kinds(resource: ResourceSpec) -> list[str]:
    """The CDI kinds a resource writes specs for (one per model when split)."""
    if resource.cdi is None or not resource.cdi.write_spec:
        return []
    kind = resource.cdi.kind or resource.name
    if resource.split is None:
        return [default_kind(kind)]
    # Without `models`, the kinds depend on the devices found at start.
    return [default_kind(f"{kind}-{model}") for model in (resource.split.models or {}).values()]


def _check_hardware(resource: ResourceSpec, at: str, fail: Fail) -> None:
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
