"""Optional dependencies, each of a pip extra: imported only where a feature needs it,
and when missing, one line that names the extra to install.

    aiohttp = require("aiohttp", "dra", "a resource served through DRA")

`udev` (pyudev: USB/PCI hot-plug from the kernel's uevents) and `dra` (aiohttp, under
devplug's client of the API server) stay extras: pyudev needs the system's libudev,
and a node that serves only device plugins talks to no API server. prometheus-client,
small and pure Python, is a plain dependency.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message says which extra has it."""


def install_hint(extra: str) -> str:
    return f"pip install 'devplug[{extra}]'"


def require(module: str, extra: str, feature: str) -> ModuleType:
    """`import module`, or MissingExtra: '<feature> needs <module>: pip install ...'."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        if error.name is not None and error.name.split(".")[0] != module.split(".")[0]:
            raise  # the package is there, something it imports is broken: say that
        raise MissingExtra(
            f"{feature} needs {module.split('.')[0]}, which is not installed: {install_hint(extra)}"
        ) from None
