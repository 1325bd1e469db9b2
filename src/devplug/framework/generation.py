"""A counter that others wait on: the one way the framework says "something changed"
(a plugin's device list, the daemon's plugin set)."""

from __future__ import annotations

import asyncio


class Generation:
    """`bump` wakes every `wait_newer`; a waiter that comes late sees the new value at
    once, so no change is missed between two waits."""

    def __init__(self) -> None:
        self._value = 0
        self._changed = asyncio.Event()

    @property
    def value(self) -> int:
        return self._value

    def bump(self) -> None:
        self._value += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_newer(self, seen: int) -> int:
        """Wait until the value is newer than `seen`; return it."""
        while self._value == seen:
            await self._changed.wait()
        return self._value
