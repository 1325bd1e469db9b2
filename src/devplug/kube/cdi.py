"""The names of the Container Device Interface as the CDI parser accepts them (kinds,
fully qualified device names), where specs live, and the ways Allocate may hand a
device to the runtime (device specs, CDI names, or both)."""

from __future__ import annotations

import re
from typing import Literal

DEFAULT_CDI_DIR = "/var/run/cdi"
CdiMode = Literal["deviceSpecs", "cdi", "both"]
CDI_MODES: tuple[CdiMode, ...] = ("deviceSpecs", "cdi", "both")

# The CDI parser's rules for the two parts of a kind and for device names.
# Compiled on first use (re keeps them), not at every start.
_VENDOR = r"^[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?$"
_CLASS = r"^[A-Za-z0-9](?:[A-Za-z0-9_-]*[A-Za-z0-9])?$"
_CDI_NAME = r"^[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*=[A-Za-z0-9_.:-]+$"


def kind_problem(kind: str) -> str | None:
    """Why `kind` is not a CDI kind ('vendor.com/class'), or None."""
    vendor, slash, cls = kind.partition("/")
    if not slash or not re.match(_VENDOR, vendor) or not re.match(_CLASS, cls):
        return (
            f"CDI kind {kind!r} must be 'vendor/class': a vendor of [A-Za-z0-9_.-] and a class "
            "of [A-Za-z0-9_-], each starting and ending with a letter or digit"
        )
    return None


def default_kind(resource_name: str) -> str:
    """The CDI kind of a resource: its name, with the class made valid
    ('example.com/u280.v2' -> 'example.com/u280-v2')."""
    vendor, _, name = resource_name.partition("/")
    return f"{vendor}/{re.sub(r'[^A-Za-z0-9_-]', '-', name)}"


def cdi_name_problem(name: str) -> str | None:
    if re.match(_CDI_NAME, name):
        return None
    return f"CDI device name {name!r} is not fully qualified ('vendor.com/class=name')"
