"""Serve plugins in a process of their own: `python -m devplug.testing.runner`.

    python -m devplug.testing.runner --plugin-dir DIR SPEC [SPEC ...]

Each SPEC is either `@FILE`, a pickle of a list of `Plugin` objects written by
`dump_plugins`, or a reference `module:attribute` (or `path/to/file.py:attribute`)
naming a `Plugin` object, a `Plugin` subclass (instantiated without arguments), or a
callable returning a `Plugin` or an iterable of them. The plugins are served with
`devplug.run` until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import copyreg
import importlib
import importlib.util
import io
import os
import pickle
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from devplug.framework.plugin import Plugin


def _mappingproxy(values: dict[Any, Any]) -> Mapping[Any, Any]:
    return MappingProxyType(values)


def _event(is_set: bool) -> asyncio.Event:
    event = asyncio.Event()
    if is_set:
        event.set()
    return event


def _reduce_mappingproxy(value: Mapping[Any, Any]) -> tuple[Any, tuple[Any, ...]]:
    return _mappingproxy, (dict(value),)


def _reduce_event(value: asyncio.Event) -> tuple[Any, tuple[Any, ...]]:
    return _event, (value.is_set(),)


def dump_plugins(plugins: Sequence[Plugin]) -> bytes:
    """Pickle plugin objects for another process. Read-only mappings and asyncio events
    (which plain pickle refuses) are rebuilt there; the plugins' classes must be
    importable by module name in that process."""
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
    table = copyreg.dispatch_table.copy()
    table[MappingProxyType] = _reduce_mappingproxy
    table[asyncio.Event] = _reduce_event
    pickler.dispatch_table = table
    try:
        pickler.dump(list(plugins))
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        names = ", ".join(type(p).__qualname__ for p in plugins)
        raise ValueError(
            f"cannot send {names} to a plugin process: {error}; define the plugin class at "
            "the top level of an importable module, or pass a 'module:attribute' reference"
        ) from error
    return buffer.getvalue()


def _import(module_ref: str) -> Any:
    if module_ref.endswith(".py"):
        path = Path(module_ref).resolve()
        folder = str(path.parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        loaded = sys.modules.get(path.stem)
        if loaded is not None and getattr(loaded, "__file__", None) == str(path):
            return loaded
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {module_ref}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(module_ref)


def resolve(reference: str) -> list[Plugin]:
    """The plugins a `module:attribute` reference names (see the module docstring)."""
    from devplug.framework.plugin import Plugin

    module_ref, sep, attribute = reference.rpartition(":")
    if not sep or not module_ref or not attribute:
        raise ValueError(f"{reference!r}: expected 'module:attribute' or 'file.py:attribute'")
    value: Any = _import(module_ref)
    for part in attribute.split("."):
        value = getattr(value, part)
    if not isinstance(value, Plugin) and callable(value):  # a class or a factory
        value = value()
    if isinstance(value, Plugin):
        return [value]
    if isinstance(value, Iterable) and not isinstance(value, str | bytes):
        plugins = list(value)
        if plugins and all(isinstance(p, Plugin) for p in plugins):
            return plugins
    raise TypeError(
        f"{reference!r} is neither a Plugin, a Plugin subclass, nor a callable returning plugins"
    )


def load(spec: str) -> list[Plugin]:
    if spec.startswith("@"):
        plugins: list[Plugin] = pickle.loads(Path(spec[1:]).read_bytes())
        return plugins
    return resolve(spec)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devplug.testing.runner")
    parser.add_argument("--plugin-dir", required=True)
    parser.add_argument("--log-level", default=os.environ.get("DEVPLUG_LOG_LEVEL", "info"))
    parser.add_argument("specs", nargs="+", metavar="SPEC")
    args = parser.parse_args(argv)

    from devplug.framework.daemon import run
    from devplug.ground.logs import setup_logging

    setup_logging(args.log_level)
    plugins = [plugin for spec in args.specs for plugin in load(spec)]
    run(*plugins, plugin_dir=args.plugin_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
