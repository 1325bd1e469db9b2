"""A plugin process a kubelet harness started, and the wait that fails at once when one
of them exits."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from devplug.ground.process import STOP_TIMEOUT_S, ChildProcess

T = TypeVar("T")

OUTPUT_TAIL = 4000


class _Harness(Protocol):
    """What a plugin process asks of its harness: calls on the simulator's loop."""

    timeout: float

    def _sync(self, fn: Callable[[], T]) -> T: ...

    def _call(self, coro: Coroutine[Any, Any, T]) -> T: ...


class PluginExited(RuntimeError):
    """A plugin process ended while the harness was waiting for something."""


class PluginProcess:
    """A plugin process started by a harness; stopped with it at the latest."""

    def __init__(
        self,
        harness: _Harness,
        child: ChildProcess,
        name: str,
        log_path: Path,
        resources: Sequence[str],
    ) -> None:
        self._harness = harness
        self._child = child
        self.name = name
        self.log_path = log_path
        # The resources it serves, when known (plugin objects, references, configs).
        self.resources = tuple(resources)
        self.stopping = False

    @property
    def args(self) -> list[str]:
        return self._child.args

    @property
    def pid(self) -> int:
        return self._child.pid

    @property
    def returncode(self) -> int | None:
        return self._harness._sync(lambda: self._child.returncode)

    @property
    def running(self) -> bool:
        return self.returncode is None

    @property
    def output(self) -> str:
        """Its stdout and stderr (logs) so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int:
        """Send `sig` (SIGKILL after `timeout` seconds) and return the exit status."""
        self.stopping = True
        return self._harness._call(self._child.stop(sig, timeout))

    def kill(self) -> int:
        return self.stop(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to end by itself; its exit status."""
        self.stopping = True
        timeout = self._harness.timeout if timeout is None else timeout
        return self._harness._call(self._child.wait(timeout))

    def _exit_future(self) -> asyncio.Future[int]:
        return self._child.exited

    def __repr__(self) -> str:
        return f"<PluginProcess {self.name} pid {self.pid}>"


async def guarded(processes: Sequence[PluginProcess], awaitable: Awaitable[T], what: str) -> T:
    """Await `awaitable`, failing at once if a running plugin process exits."""
    main = asyncio.ensure_future(awaitable)
    watched = {p._exit_future(): p for p in processes if not p.stopping and p.running}
    waiting: set[asyncio.Future[Any]] = {main, *watched}
    try:
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        main.cancel()
        raise
    if main.done():
        return main.result()
    main.cancel()
    with contextlib.suppress(BaseException):
        await main
    process = next(p for f, p in watched.items() if f.done())
    output = process.output[-OUTPUT_TAIL:]
    raise PluginExited(
        f"plugin process {process.name} exited with status {process._child.returncode} "
        f"while waiting for {what}; its output:\n{output}"
    )
