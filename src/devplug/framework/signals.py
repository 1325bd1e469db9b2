"""Stopping long-running services on SIGTERM and SIGINT; SIGHUP held for the config
reloader. Light to import (asyncio loads only when a stop is awaited): `devplug serve`
imports it first of all, before it keeps the ssl module out."""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger("devplug.signals")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Asks a daemon to read its config again (devplug.sources.reload).
RELOAD_SIGNAL = signal.SIGHUP
_reload_held = False


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
        stop.set()

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        yield stop
    finally:
        for signum in STOP_SIGNALS:
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signum)
