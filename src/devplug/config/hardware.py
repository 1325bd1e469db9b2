"""The config keys of real hardware: sysfs selectors (USB, PCI), health checks, CDI,
per-model pools, preferred-allocation policies, node features.

Blocks of a resource entry (devplug.config.resource) and of the root (`nodeFeatures`),
checked with the same one-line errors (`fail(field, problem)`); the sysfs source
matches devices by the selectors' helpers here.
"""

from __future__ import annotations

import re
import string
from typing import Literal

import msgspec

from devplug.config.errors import Fail
from devplug.ground.trust import program_problem
from devplug.kube.cdi import CDI_MODES, DEFAULT_CDI_DIR, CdiMode, kind_problem

DEFAULT_SYSFS_ROOT = "/sys"
DEFAULT_DEV_ROOT = "/dev"
# Where node-feature-discovery reads feature files (its local source).
DEFAULT_FEATURE_FILE = "/etc/kubernetes/node-feature-discovery/features.d/devplug"
MAX_HEALTH_TIMEOUT_S = 300.0
Policy = Literal["numa", "pack", "spread", "pci"]
POLICIES: tuple[Policy, ...] = ("numa", "pack", "spread", "pci")
# The attributes a pool can split a resource by; those that are hex IDs.
SPLIT_KEYS = ("productID", "vendorID", "pciClass", "driver", "model", "usbInterfaceClass")
HEX_KEYS = ("productID", "vendorID", "pciClass", "usbInterfaceClass")
# Placeholders allowed in selector paths and health checks: '{pciAddress}', '{id}'...
PLACEHOLDERS = ("id", "pciAddress", "iommuGroup", "serial", "vendorID", "productID", "driver")


class _Schema(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    pass


# A selector value: one string or a list of them (any one matches).
Values = str | list[str]


class UsbSelector(_Schema):
    vendor: Values | None = None
    product: Values | None = None
    serial: Values | None = None
    interface_class: Values | None = None


class PciSelector(_Schema):
    vendor: Values | None = None
    device: Values | None = None
    # '0x030200' (exact), '0x0302' (class and subclass) or 'value/mask' ('0x0300/0xff00').
    class_: Values | None = msgspec.field(default=None, name="class")
    driver: Values | None = None
    address: Values | None = None


class CheckSpec(_Schema):
    # One of: a sysfs attribute of the device (relative to its sysfs folder) that must
    # have a value (`value`, or any non-empty one); a file that must exist; a command
    # (argument list, no shell) that must exit 0 within `timeout` seconds.
    attribute: str | None = None
    value: str | None = None
    file: str | None = None
    command: list[str] | None = None
    timeout: float = 5.0


class HealthSpec(_Schema):
    checks: list[CheckSpec]
    interval: float = 10.0


class CdiSpec(_Schema):
    mode: str = "deviceSpecs"
    kind: str | None = None
    dir: str = DEFAULT_CDI_DIR
    write_spec: bool = True


class SplitSpec(_Schema):
    by: str
    # Attribute value -> model name; each model becomes '<resource>-<model>'. Without
    # it, one resource per value among the devices there at start ('<resource>-0x500c').
    models: dict[str, str] | None = None


class NodeFeaturesSpec(_Schema):
    path: str = DEFAULT_FEATURE_FILE


# -- values -----------------------------------------------------------------------------

_HEX = re.compile(r"^(0x)?[0-9a-fA-F]+$")


def values(value: Values | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def hex_value(text: str) -> int:
    return int(text, 16)


def class_filter(text: str) -> tuple[int, int, int]:
    """'0x0300/0xff00' -> (0x0300, 0xff00, 8): (class >> shift) & mask == value & mask.
    A value of up to 4 hex digits is class and subclass; 6 digits include the prog-if."""
    value_text, _, mask_text = text.partition("/")
    digits = len(value_text.lower().removeprefix("0x"))
    shift = 0 if digits > 4 else 8
    full = 0xFFFFFF if shift == 0 else 0xFFFF
    value = int(value_text, 16)
    mask = int(mask_text, 16) if mask_text else full
    return value, mask, shift


def class_matches(pci_class: str, text: str) -> bool:
    """Whether a class code ('0x030200') passes a `class` filter ('0x0300/0xff00')."""
    wanted, mask, shift = class_filter(text)
    return (int(pci_class, 16) >> shift) & mask == wanted & mask


def mode_of(spec: CdiSpec | None) -> CdiMode:
    if spec is None:
        return "deviceSpecs"
    for mode in CDI_MODES:
        if spec.mode == mode:
            return mode
    raise ValueError(spec.mode)


# -- checks -----------------------------------------------------------------------------


def _hex_problem(text: str, digits: int) -> str | None:
    if not _HEX.match(text) or len(text.lower().removeprefix("0x")) > digits:
        return f"expected a hex ID of up to {digits} digits (e.g. '0x10de'), got {text!r}"
    return None


def check_usb(usb: UsbSelector, at: str, fail: Fail) -> None:
    if all(v is None for v in (usb.vendor, usb.product, usb.serial, usb.interface_class)):
        fail(at, "a selector with no field matches every device: name at least one")
    for field, value, digits in (
        ("vendor", usb.vendor, 4),
        ("product", usb.product, 4),
        ("interfaceClass", usb.interface_class, 2),
    ):
        for k, text in enumerate(values(value)):
            where = f"{at}.{field}" if isinstance(value, str) else f"{at}.{field}[{k}]"
            if problem := _hex_problem(text, digits):
                fail(where, problem)
    if isinstance(usb.serial, list) and not usb.serial:
        fail(f"{at}.serial", "expected at least one serial")


def check_pci(pci: PciSelector, at: str, fail: Fail) -> None:
    fields = (pci.vendor, pci.device, pci.class_, pci.driver, pci.address)
    if all(v is None for v in fields):
        fail(at, "a selector with no field matches every device: name at least one")
    for field, value in (("vendor", pci.vendor), ("device", pci.device)):
        for k, text in enumerate(values(value)):
            where = f"{at}.{field}" if isinstance(value, str) else f"{at}.{field}[{k}]"
            if problem := _hex_problem(text, 4):
                fail(where, problem)
    for k, text in enumerate(values(pci.class_)):
        where = f"{at}.class" if isinstance(pci.class_, str) else f"{at}.class[{k}]"
        value_text, slash, mask_text = text.partition("/")
        if problem := _hex_problem(value_text, 6):
            fail(where, problem)
        if slash and (problem := _hex_problem(mask_text, 6)):
            fail(where, f"mask: {problem}")
        if slash and len(mask_text.lower().removeprefix("0x")) > (
            4 if len(value_text.lower().removeprefix("0x")) <= 4 else 6
        ):
            fail(where, f"mask {mask_text!r} is wider than the value {value_text!r}")
        wanted, mask, _ = class_filter(text)
        if wanted & ~mask:
            fail(where, f"{text!r} can never match: the value has bits outside the mask")
    for k, text in enumerate(values(pci.address)):
        where = f"{at}.address" if isinstance(pci.address, str) else f"{at}.address[{k}]"
        if not re.match(r"^([0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$", text):
            fail(where, f"expected a PCI address such as '0000:3b:00.0', got {text!r}")


def check_placeholders(text: str, where: str, fail: Fail) -> None:
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]
    except ValueError as e:
        fail(where, f"bad placeholder in {text!r}: {e}")
    for name in names:
        if name not in PLACEHOLDERS:
            fail(
                where,
                f"unknown placeholder {{{name}}} in {text!r}: expected one of "
                + ", ".join("{" + p + "}" for p in PLACEHOLDERS),
            )


def check_health(health: HealthSpec, at: str, selector: bool, fail: Fail) -> None:
    if not health.checks:
        fail(f"{at}.checks", "expected at least one check")
    if not 0.1 <= health.interval <= 3600:
        fail(f"{at}.interval", f"expected seconds between 0.1 and 3600, got {health.interval}")
    for k, check in enumerate(health.checks):
        where = f"{at}.checks[{k}]"
        kinds = [n for n in ("attribute", "file", "command") if getattr(check, n) is not None]
        if len(kinds) != 1:
            fail(where, "expected exactly one of 'attribute', 'file', 'command'")
        if check.value is not None and check.attribute is None:
            fail(f"{where}.value", "only allowed with 'attribute'")
        if check.attribute is not None:
            if not selector:
                fail(f"{where}.attribute", "needs a 'usb' or 'pci' selector: it is read in sysfs")
            if check.attribute.startswith("/") or ".." in check.attribute.split("/"):
                fail(f"{where}.attribute", "expected a path inside the device's sysfs folder")
        if check.file is not None:
            if not check.file.startswith("/"):
                fail(f"{where}.file", f"expected an absolute path, got {check.file!r}")
            check_placeholders(check.file, f"{where}.file", fail)
        if check.command is not None:
            if not check.command or not check.command[0]:
                fail(f"{where}.command", "expected a program and its arguments")
            for j, arg in enumerate(check.command):
                check_placeholders(arg, f"{where}.command[{j}]", fail)
            if "{" not in check.command[0] and (problem := program_problem(check.command[0])):
                fail(f"{where}.command[0]", problem)
        if not 0 < check.timeout <= MAX_HEALTH_TIMEOUT_S:
            fail(
                f"{where}.timeout",
                f"expected seconds > 0 and <= {MAX_HEALTH_TIMEOUT_S:g}, got {check.timeout}",
            )


def check_cdi(cdi: CdiSpec, at: str, fail: Fail) -> None:
    if cdi.mode not in CDI_MODES:
        fail(f"{at}.mode", f"expected one of {', '.join(CDI_MODES)}, got {cdi.mode!r}")
    if cdi.kind is not None and (problem := kind_problem(cdi.kind)):
        fail(f"{at}.kind", problem)
    if not cdi.dir.startswith("/"):
        fail(f"{at}.dir", f"expected an absolute path, got {cdi.dir!r}")


def _kind_problem(by: str, is_pci: bool) -> str | None:
    """Why no device of the kind (PCI or USB) has the attribute `by`."""
    if by in ("pciClass", "driver") and not is_pci:
        return f"a USB device has no {by}"  # a USB device's drivers are per interface
    if by == "usbInterfaceClass" and is_pci:
        return "a PCI device has no usbInterfaceClass"
    return None


# The selector field that constrains each split key: (attribute, name in the config).
_PCI_SPLIT_FIELDS = {
    "productID": ("device", "device"),
    "vendorID": ("vendor", "vendor"),
    "pciClass": ("class_", "class"),
    "driver": ("driver", "driver"),
}
_USB_SPLIT_FIELDS = {
    "productID": ("product", "product"),
    "vendorID": ("vendor", "vendor"),
    "usbInterfaceClass": ("interface_class", "interfaceClass"),
}


def never_selected(
    by: str, value: str, usb: UsbSelector | None, pci: PciSelector | None
) -> str | None:
    """Why a group with these selectors can never select a device whose attribute `by`
    is `value` (None: it may)."""
    if problem := _kind_problem(by, pci is not None):
        return problem
    selector: UsbSelector | PciSelector | None = pci if pci is not None else usb
    kind, fields = ("pci", _PCI_SPLIT_FIELDS) if pci is not None else ("usb", _USB_SPLIT_FIELDS)
    if by not in fields:
        return None
    attribute, name = fields[by]
    choices = values(getattr(selector, attribute))
    if not choices:
        return None
    if by == "pciClass":
        ok = any(class_matches(value, c) for c in choices)
    elif by == "driver":
        ok = value in choices
    else:
        ok = any(hex_value(value) == hex_value(c) for c in choices)
    return None if ok else f"{kind}.{name} selects only {', '.join(choices)}"


def check_split(
    split: SplitSpec,
    at: str,
    groups: list[tuple[UsbSelector | None, PciSelector | None]],
    fail: Fail,
) -> None:
    """`groups`: the selectors of the resource's groups, so that a model no group can
    select is refused."""
    if split.by not in SPLIT_KEYS:
        fail(f"{at}.by", f"expected one of {', '.join(SPLIT_KEYS)}, got {split.by!r}")
    if groups and all(kinds := [_kind_problem(split.by, pci is not None) for _, pci in groups]):
        fail(f"{at}.by", f"{split.by!r} splits nothing: {kinds[0]}")
    if split.models is None:
        return
    if not split.models:
        fail(f"{at}.models", "expected at least one value: model name (or no 'models')")
    seen: dict[str, str] = {}
    for value, model in split.models.items():
        where = f"{at}.models.{value}"
        if not re.match(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$", model):
            fail(where, f"model {model!r} is not usable in a resource name")
        if model in seen:
            fail(where, f"model {model!r} is already the model of {seen[model]!r}")
        seen[model] = value
        if split.by in HEX_KEYS and (problem := _hex_problem(value, 6)):
            fail(where, problem)
        reasons = [never_selected(split.by, value, usb, pci) for usb, pci in groups]
        if groups and (first := reasons[0]) and all(reasons):
            field = "groups[0]." if first.startswith(("pci.", "usb.")) else ""
            fail(where, f"can never match: {field}{first}")
