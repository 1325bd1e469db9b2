"""Keep something in step with the device lists of several plugins."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from devplug.framework.plugin import Plugin


async def follow(plugins: Sequence[Plugin], update: Callable[[], None]) -> None:
    """Call `update()` once every plugin has published, then after every change of any
    device list; runs until cancelled. Event-driven: `Plugin.wait_changed`, no polling."""
    await asyncio.gather(*(p.wait_published() for p in plugins))
    generations = [p.generation for p in plugins]
    update()
    if not plugins:
        await asyncio.Event().wait()  # nothing will change: wait to be cancelled
    while True:
        waits = [
            asyncio.ensure_future(p.wait_changed(g))
            for p, g in zip(plugins, generations, strict=True)
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        generations = [p.generation for p in plugins]
        update()
