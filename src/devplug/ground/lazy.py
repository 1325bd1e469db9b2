"""Package namespaces whose names load on first use."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, which exports each name of `exports`
    from the module it maps to, imported only when the name is first used: importing
    one submodule (the CLI, the pytest plugin) then does not pull in everything."""
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__


def block_ssl() -> None:
    """Keep the ssl module out (asyncio loads it when it can): a daemon on unix sockets
    saves its load time and memory. Call before anything imports asyncio."""
    sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]


def allow_ssl() -> None:
    """Undo `block_ssl`, before importing a library that needs TLS (the Kubernetes
    client)."""
    if sys.modules.get("ssl", False) is None:
        del sys.modules["ssl"]
