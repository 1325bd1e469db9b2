"""Child processes whose exit an asyncio loop can await without polling.

`ChildProcess` wraps `subprocess.Popen`; its `exited` future resolves when the process
ends, through a pidfd (Linux 5.3+) watched by the loop, or else a thread blocked in
`waitpid`. Nothing sleeps or polls. `stop()` sends a signal, waits, and kills after a
timeout; `kill_now()` is the synchronous last resort for cleanup paths that run when
the loop is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

STOP_TIMEOUT_S = 10.0


class ChildProcess:
    """A subprocess started on (and watched by) the running event loop."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        stdout: IO[Any] | int | None = None,
        stderr: IO[Any] | int | None = None,
    ) -> None:
        self.args = list(args)
        self._loop = asyncio.get_running_loop()
        self.popen = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            env=dict(env) if env is not None else None,
            cwd=cwd,
        )
        self.exited: asyncio.Future[int] = self._loop.create_future()
        self._watch()

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once the loop has seen the exit (negative: killed by a signal)."""
        return self.exited.result() if self.exited.done() else None

    def _watch(self) -> None:
        try:
            fd = os.pidfd_open(self.popen.pid)
        except (AttributeError, OSError):
            thread = threading.Thread(
                target=self._wait_in_thread, name=f"wait {self.popen.pid}", daemon=True
            )
            thread.start()
            return

        def readable() -> None:
            self._loop.remove_reader(fd)
            os.close(fd)
            self._finish()

        self._loop.add_reader(fd, readable)

    def _wait_in_thread(self) -> None:
        self.popen.wait()
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self._loop.call_soon_threadsafe(self._finish)

    def _finish(self) -> None:
        code = self.popen.wait()  # reaps the child; it has exited, so this does not block
        if not self.exited.done():
            self.exited.set_result(code)

    def send_signal(self, sig: int) -> None:
        if self.popen.returncode is None and not self.exited.done():
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)

    async def wait(self, timeout: float | None = None) -> int:
        """The exit status, waiting up to `timeout` seconds (TimeoutError after)."""
        return await asyncio.wait_for(asyncio.shield(self.exited), timeout)

    async def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int:
        """Send `sig`, wait for the exit; SIGKILL when it takes longer than `timeout`."""
        self.send_signal(sig)
        try:
            return await self.wait(timeout)
        except TimeoutError:
            self.send_signal(signal.SIGKILL)
            return await asyncio.shield(self.exited)

    def kill_now(self) -> None:
        """Kill and reap the process at once, from any thread, loop or not."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()
            self.popen.wait()
