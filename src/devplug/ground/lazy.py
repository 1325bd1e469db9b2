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
    client). The asyncio modules loaded while ssl was out hold None for it and would
    refuse a TLS connection: they are given the module, and asyncio's TLS protocol
    (whose names are defined only with ssl there) is loaded again."""
    if sys.modules.get("ssl", False) is not None:
        return
    del sys.modules["ssl"]
    import importlib
    import ssl

    for name in ("asyncio.base_events", "asyncio.selector_events"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "ssl", False) is None:
            module.ssl = ssl  # type: ignore[attr-defined]
    sslproto = sys.modules.get("asyncio.sslproto")
    if sslproto is not None and getattr(sslproto, "ssl", False) is None:
        importlib.reload(sslproto)
