"""Stopping on SIGTERM as on SIGINT, for every command; SIGHUP held for the config
reloader. Light to import (asyncio loads only when a stop is awaited): `devplug serve`
imports it first of all, before it keeps the ssl module out.

`terminate_like_interrupt()` (installed by `devplug`'s main before any command runs)
makes SIGTERM, what a CI timeout, `kill` or the kubelet sends, do exactly what Ctrl-C
does: it calls the SIGINT handler in place, so a command's clean-up for Ctrl-C (its
`finally` blocks, asyncio.run cancelling its tasks, temporary folders removed) runs
for SIGTERM too, and none needs a clean-up path of its own. `stop_on_signals()` is
the same for long-running services, as an event their loop waits on.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger("devplug.signals")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_received: list[signal.Signals] = []
# Asks a daemon to read its config again (devplug.sources.reload).
RELOAD_SIGNAL = signal.SIGHUP
_reload_held = False


def terminate_like_interrupt() -> None:
    """SIGTERM from now on calls whatever handles SIGINT at that moment (Python's
    KeyboardInterrupt, asyncio.run's cancellation of its task, a service's stop)."""

    def forward(signum: int, frame: FrameType | None) -> None:
        _received.append(signal.Signals(signum))
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:  # SIGINT ignored or default: end as Ctrl-C would end this process
            signal.default_int_handler(signal.SIGINT, frame)

    signal.signal(signal.SIGTERM, forward)


def received() -> signal.Signals | None:
    """The first stop signal this process was sent, if any."""
    return _received[0] if _received else None


def hold_reload_signal() -> None:
    """Catch SIGHUP from the daemon's first moment, before its config reloader listens
    (the signal's default ends the process); one received meanwhile is kept, and
    `take_held_reload` hands it to the reloader."""

    def hold(_signum: int, _frame: object) -> None:
        global _reload_held
        _reload_held = True

    signal.signal(RELOAD_SIGNAL, hold)


def take_held_reload() -> bool:
    """Whether SIGHUP came while held (cleared by the call)."""
    global _reload_held
    held, _reload_held = _reload_held, False
    return held


@contextlib.contextmanager
def stop_on_signals() -> Iterator[asyncio.Event]:
    """An event set by SIGTERM or SIGINT while the block runs (inside an event loop)."""
    import asyncio

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: signal.Signals) -> None:
        log.info("%s received, shutting down", signum.name)
        _received.append(signum)
        stop.set()

    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signum)
                if handler is not None:
                    signal.signal(signum, handler)  # not the default removal leaves
