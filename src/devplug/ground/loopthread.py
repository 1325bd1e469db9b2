"""An event loop in a background thread, and blocking calls onto it: how threaded code
drives asynchronous code (the kubelet harness's synchronous tests drive the simulator;
the scheduler extender's HTTP threads call devplug's asyncio client)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from devplug.ground.process import STOP_TIMEOUT_S

T = TypeVar("T")


class LoopThread:
    """A loop of its own, run by a daemon thread between `_start_loop` and `_stop_loop`."""

    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None

    def _start_loop(self, name: str) -> None:
        loop = asyncio.new_event_loop()
        started: Future[None] = Future()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(started.set_result, None)
            loop.run_forever()

        self._thread = threading.Thread(target=serve, name=name, daemon=True)
        self._loop = loop
        self._thread.start()
        started.result()

    def _stop_loop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if loop.is_running():

            async def cancel_all() -> None:
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(STOP_TIMEOUT_S)
            loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
        self._loop = self._thread = None

    def run(self, awaitable: Awaitable[T]) -> T:
        """Run a coroutine on the loop and return its result."""

        async def wrap() -> T:
            return await awaitable

        return self._call(wrap())

    def _in_loop(self) -> bool:
        return self._thread is not None and threading.get_ident() == self._thread.ident

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._loop
        if loop is None:
            coro.close()
            raise RuntimeError(f"{type(self).__name__}: its loop is not started")
        if self._in_loop():
            coro.close()
            raise RuntimeError(f"{type(self).__name__}: a blocking call from its own loop")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def _sync(self, fn: Callable[[], T]) -> T:
        """`fn()` on the loop thread (where the state the loop serves lives)."""
        if self._in_loop() or self._loop is None:
            return fn()

        async def go() -> T:
            return fn()

        return self._call(go())
