"""Blocking calls (NVML) off the event loop, each on a thread of its own, with a timeout.

A call that hangs in the driver cannot be interrupted; it is abandoned on its daemon
thread and the caller gets `Hung` instead of a loop that stops answering the kubelet.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Hung(TimeoutError):
    """A blocking call did not return in time."""


async def call(fn: Callable[[], T], timeout: float, what: str) -> T:
    """`fn()` on a new daemon thread; its result, its exception, or `Hung` after `timeout`."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        result: T | None = None
        error: BaseException | None = None
        try:
            result = fn()
        except BaseException as e:
            error = e
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=work, name=f"nvml {what}", daemon=True).start()
    try:
        # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a
        # cancellation that comes as the call returns, and a stop would then hang.
        async with asyncio.timeout(timeout):
            return await asyncio.shield(future)
    except TimeoutError:
        raise Hung(f"{what} did not return within {timeout:g} s") from None


def call_sync(fn: Callable[[], T], timeout: float, what: str) -> T:
    """`call` for code without a loop (start-up, `devplug check`)."""
    box: dict[str, object] = {}

    def work() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:
            box["error"] = e

    thread = threading.Thread(target=work, name=f"nvml {what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise Hung(f"{what} did not return within {timeout:g} s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]
