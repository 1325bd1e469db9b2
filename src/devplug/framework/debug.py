"""A window into a running daemon for the fault tests: on SIGUSR1 the daemon writes
how many asyncio tasks and threads it has to a file, so that a leak of tasks across
thousands of restarts can be counted from outside (fds and threads are in /proc).

Off unless DEVPLUG_DEBUG_STATE names the file; nothing of it is on the serving path.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import signal
import sys
import threading
from pathlib import Path
from typing import Any

DEBUG_STATE_ENV = "DEVPLUG_DEBUG_STATE"


class DebugState:
    """A daemon service: SIGUSR1 -> {"seq", "tasks", "threads", "task_names",
    "modules"} in `path`."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._seq = 0

    async def run(self, daemon: Any) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, self.dump)
        try:
            await loop.create_future()  # until cancelled at shutdown
        finally:
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signal.SIGUSR1)

    def dump(self) -> None:
        import json  # only when asked: `devplug serve` stays lean

        from devplug.ground.files import write_atomic

        self._seq += 1
        tasks = asyncio.all_tasks()
        names = collections.Counter(_kind(t) for t in tasks)
        state = {
            "seq": self._seq,
            "tasks": len(tasks),
            "threads": threading.active_count(),
            "task_names": dict(sorted(names.items())),
            "modules": sorted(k for k, v in sys.modules.items() if v is not None),
        }
        write_atomic(self.path, json.dumps(state), mode=0o600)


def _kind(task: asyncio.Task[Any]) -> str:
    """A task's name, or for an unnamed one ("Task-123") what it runs."""
    name = task.get_name()
    head, _, tail = name.rpartition("-")
    if head == "Task" and tail.isdigit():
        coro = task.get_coro()
        return str(getattr(coro, "__qualname__", head))
    return name
