"""The demo's plugin daemon: `devplug serve` with the packaged default config, as a
child process in a session of its own, its stderr in a file; a wait on the simulator
that ends at once when it dies."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    pass

T = TypeVar("T")

STOP_TIMEOUT_S = 5.0
STDERR_TAIL = 4000


class DemoFailed(Exception):
    """The story cannot go on; `str()` says why."""


class PluginDied(DemoFailed):
    def __init__(self, code: int) -> None:
        super().__init__(f"the plugin process exited with status {code} before the demo ended")
        self.code = code


def serve_command(plugin_dir: Path, log_level: str = "info") -> list[str]:
    """`devplug serve` with the packaged default config, as a child of this Python."""
    return [
        sys.executable,
        "-m",
        "devplug.cli.main",
        "--log-level",
        log_level,
        "serve",
        "--plugin-dir",
        str(plugin_dir),
    ]


class PluginProcess:
    """The plugin daemon as a child process, with its stderr in a file."""

    def __init__(self, command: Sequence[str], log_path: Path) -> None:
        self.command = list(command)
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None
        self.started = 0.0
        self._exited: asyncio.Task[int] | None = None

    async def start(self) -> int:
        with self.log_path.open("wb") as stderr:
            try:
                self.proc = await asyncio.create_subprocess_exec(
                    *self.command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                    # Its own session: a terminal's Ctrl-C reaches the demo only, which then
                    # stops the plugin itself (and says so).
                    start_new_session=True,
                )
            except OSError as error:
                raise DemoFailed(f"cannot start the plugin process: {error}") from None
        self.started = time.time()
        self._exited = asyncio.create_task(self.proc.wait(), name="plugin exit")
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc is not None else None

    def check(self) -> None:
        """Raise PluginDied if the process has exited."""
        if self._exited is not None and self._exited.done():
            raise PluginDied(self._exited.result())

    async def guard(self, awaitable: Awaitable[T]) -> T:
        """Await `awaitable`, unless the plugin process exits first (PluginDied)."""
        self.check()
        assert self._exited is not None
        task = asyncio.ensure_future(awaitable)
        try:
            await asyncio.wait({task, self._exited}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if task.done() and not task.cancelled():
            return task.result()
        self.check()
        raise DemoFailed("the wait was cancelled")  # not reached: the exit is done

    def stderr(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-STDERR_TAIL:]

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not stop in time."""
        proc = self.proc
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if self._exited is not None and not self._exited.done():
            self._exited.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._exited
