"""The `mode` and `dra:` keys of a resource: how it is served (device plugin, DRA
driver, or both) and how its DRA driver publishes it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NoReturn

import msgspec

from devplug.framework.device import Attribute

MODE_DEVICE_PLUGIN = "devicePlugin"
MODE_DRA = "dra"
MODE_BOTH = "both"
Mode = Literal["devicePlugin", "dra", "both"]


class DraSpec(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    # The driver name (a DNS subdomain); default: '<resource short name>.<domain>'.
    driver: str | None = None
    # Attributes published for every device of the resource (model, vendor...).
    attributes: dict[str, Attribute] = {}
    # Published names of device attributes: {model: productName}.
    attribute_names: dict[str, str] = {}


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
