"""A harness wait that wakes on the kubelet's events and on the plugins' logs.

A condition on what a plugin process logs changes without a kubelet event: a wait woken
only by events would sleep to its deadline and then pass, late by the whole timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from devplug.ground.dirwatch import DirWatcher, Mask

if TYPE_CHECKING:
    from devplug.simulator import Kubelet


async def until(
    kubelet: Kubelet, logs: Path, predicate: Callable[[], bool], timeout: float, what: str
) -> None:
    """Until `predicate()` holds, re-checked after every kubelet event and every write
    to a file in `logs`; TimeoutError after `timeout` seconds, as the kubelet's waits."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    written = asyncio.Event()
    watcher: DirWatcher[str] = DirWatcher(
        lambda _folder, _name: written.set(), mask=Mask.MODIFY | Mask.CREATE
    )
    watcher.watch(str(logs))
    reading = asyncio.create_task(watcher.run())
    try:
        while True:
            written.clear()  # before the check: a write after it wakes the wait below
            if predicate():
                return
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")

            def newer(seen: int = kubelet.last_event_seq) -> bool:
                return kubelet.last_event_seq != seen

            waits = (
                asyncio.ensure_future(kubelet.wait_for(newer, left, what)),
                asyncio.ensure_future(written.wait()),
            )
            try:
                await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in waits:
                    task.cancel()
                await asyncio.gather(*waits, return_exceptions=True)
    finally:
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reading
        watcher.close()
