"""Keep something in step with the device lists of a daemon's plugins."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from devplug.framework.plugin import Plugin

if TYPE_CHECKING:
    from devplug.framework.daemon import Daemon


async def follow(
    daemon: Daemon,
    update: Callable[[Sequence[Plugin]], None],
    select: Callable[[Plugin], bool] = lambda _plugin: True,
) -> None:
    """Call `update(plugins)` with the daemon's plugins that `select` keeps, once each has
    published, then after every change of any device list and of the plugin set (a
    config reload adds and removes plugins); runs until cancelled. Event-driven
    (`Plugin.wait_changed`, `Daemon.wait_plugins_changed`), no polling."""
    while True:
        served = daemon.plugins_generation
        plugins = [p for p in daemon.plugins if select(p)]
        set_changed = asyncio.ensure_future(daemon.wait_plugins_changed(served))
        try:
            if await _first(set_changed, *(p.wait_published() for p in plugins)):
                continue  # the set changed before all published: select again
            while True:
                generations = [p.generation for p in plugins]
                update(plugins)
                waits = (p.wait_changed(g) for p, g in zip(plugins, generations, strict=True))
                if await _first(set_changed, *waits, every=False):
                    break
        finally:
            set_changed.cancel()
            await asyncio.gather(set_changed, return_exceptions=True)


async def _first(stop: asyncio.Future[Any], *waits: Any, every: bool = True) -> bool:
    """Wait until every one of `waits` is done (with `every=False`: any one) or `stop` is;
    True when `stop` is. Unfinished waits are cancelled, `stop` never."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    watched = [asyncio.gather(*tasks, return_exceptions=True)] if every else tasks
    try:
        await asyncio.wait({stop, *watched}, return_when=asyncio.FIRST_COMPLETED)
        return stop.done()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*watched, *tasks, return_exceptions=True)
