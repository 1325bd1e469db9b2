"""The `mode` and `dra:` keys of a resource: how it is served (device plugin, DRA
driver, or both) and how its DRA driver publishes it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, NoReturn

import msgspec

from devplug.framework.device import Attribute

MODE_DEVICE_PLUGIN = "devicePlugin"
MODE_DRA = "dra"
MODE_BOTH = "both"
Mode = Literal["devicePlugin", "dra", "both"]
MODES = (MODE_DEVICE_PLUGIN, MODE_DRA, MODE_BOTH)
# DeviceTaint effects (resource.k8s.io/v1): None is informational only.
TaintEffect = Literal["NoSchedule", "NoExecute", "None"]


class DraSpec(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    # The driver name (a DNS subdomain); default: '<resource short name>.<domain>'.
    driver: str | None = None
    # Attributes published for every device of the resource (model, vendor...).
    attributes: dict[str, Attribute] = {}
    # Published names of device attributes: {model: productName}.
    attribute_names: dict[str, str] = {}
    # The extended resource name of the resource's DeviceClass: pods asking it by
    # count (`devplug.io/null: 1`) get devices through DRA on nodes that serve it that
    # way. Default: the resource's name; '': none (claims only).
    extended_resource_name: str | None = None
    # The effect of the taint an unhealthy device gets in the slices.
    taint_effect: TaintEffect = "NoSchedule"


def serves_device_plugin(mode: str) -> bool:
    return mode in (MODE_DEVICE_PLUGIN, MODE_BOTH)


def serves_dra(mode: str) -> bool:
    return mode in (MODE_DRA, MODE_BOTH)


def check_attributes(
    attributes: dict[str, Attribute], at: str, fail: Callable[[str, str], NoReturn]
) -> None:
    """Attribute names and values a ResourceSlice accepts."""
    if not attributes:
        return
    from devplug.framework.dra.slices import attribute_problem

    for name, value in attributes.items():
        if problem := attribute_problem(name, value):
            fail(f"{at}.{name}", problem)


def check_dra(spec: DraSpec, at: str, fail: Callable[[str, str], NoReturn]) -> None:
    from devplug.framework.dra.names import attribute_name_problem, driver_name_problem

    if spec.driver is not None and (problem := driver_name_problem(spec.driver)):
        fail(f"{at}.driver", problem)
    check_attributes(spec.attributes, f"{at}.attributes", fail)
    for key, name in spec.attribute_names.items():
        if problem := attribute_name_problem(name):
            fail(f"{at}.attributeNames.{key}", problem)


def driver_name(resource_name: str, spec: DraSpec | None) -> str:
    """The resource's DRA driver: `dra.driver`, or one derived from the resource name."""
    if spec is not None and spec.driver is not None:
        return spec.driver
    from devplug.framework.dra.names import default_driver_name

    return default_driver_name(resource_name)


def plugin_driver_name(resource_name: str, spec_name: str, spec: DraSpec | None) -> str:
    """The driver of one plugin of a config entry. Without `dra.driver`, one derived
    from the plugin's resource name. With it, the entry's own resource gets it, and the
    further resources an entry serves (a GPU entry's MIG profiles or models) get
    '<their short name>.<dra.driver>'."""
    from devplug.framework.dra.names import MAX_LABEL, default_driver_name

    if spec is None or spec.driver is None:
        return default_driver_name(resource_name)
    if resource_name == spec_name:
        return spec.driver
    label = default_driver_name(resource_name).partition(".")[0]
    return f"{label}.{spec.driver}"[:MAX_LABEL].rstrip(".-")


def extended_resource_name(
    resource_name: str, spec_name: str, mode: str, spec: DraSpec | None
) -> str | None:
    """The extended resource name the DeviceClass of one plugin of a config entry
    carries, or None. `dra.extendedResourceName` names the entry's own resource; the
    further resources of an entry (a split's models, a GPU entry's MIG profiles) keep
    their own names, except in `both` mode, where those names are the device plugin's."""
    explicit = spec.extended_resource_name if spec is not None else None
    if explicit == "":
        return None
    if resource_name == spec_name:
        return explicit or resource_name
    return None if explicit is not None or mode == MODE_BOTH else resource_name


def served_twice(
    entries: Sequence[tuple[str, str, DraSpec | None]],
) -> tuple[int, str] | None:
    """(entry index, problem) when a name would be served on a node both as a device
    plugin and as the extended resource of a DRA DeviceClass, which the scheduler
    forbids (KEP 5004: a node serves an extended resource one way). `entries` are
    (resource name, mode, dra spec) of each config entry."""
    counted = {name for name, mode, _ in entries if serves_device_plugin(mode)}
    for index, (name, mode, spec) in enumerate(entries):
        if not serves_dra(mode):
            continue
        extended = extended_resource_name(name, name, mode, spec)
        if extended is not None and extended in counted:
            how = (
                f"mode '{mode}' serves {name!r} as a device plugin"
                if extended == name
                else f"{extended!r} is served as a device plugin"
            )
            return index, (
                f"{how} and as the extended resource of its DRA DeviceClass "
                "(dra.extendedResourceName): a node serves a name one way; set "
                "dra.extendedResourceName to another name or to '' (claims only), or "
                "choose the mode per node with nodeModeLabel"
            )
    return None
