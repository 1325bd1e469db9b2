"""The event loop's watchdog: says when a blocking call held the loop, for how long and
in which plugin hook.

Every resource of a daemon is served by one event loop, so one blocking call in one
plugin's async hook (`time.sleep`, a blocking read, a slow library) stalls the
Allocate of every other resource, silently. A thread beside the loop asks the loop
for a heartbeat every `BEAT_S`; when none comes for longer than `BLOCKED_S`, it reads
the loop thread's stack to find the hook it is in, and once the loop runs again one
line is logged: `event loop blocked for 7.5 s in example.com/a: Widgets.allocate
(widgets.py:42)`. (asyncio's debug mode names slow callbacks too, but costs every
callback a timing and names a Task's step rather than the hook.) The thread asks, rather
than the loop beating on a timer of its own: a loop with a timer always pending waits
in the kernel with a timeout at every turn, which cost each Allocate ~3 % of its CPU
(`make bench`, "floor").
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from types import FrameType

log = logging.getLogger("devplug.watchdog")

BLOCKED_S = 1.0  # a stall past this is said (the kubelet's Allocate waits ~2 minutes)
BEAT_S = 0.25
STILL_BLOCKED_S = 10.0  # a stall that does not end is said once meanwhile
_ASYNCIO = os.path.dirname(asyncio.__file__)
_SELECTORS = os.path.join(os.path.dirname(os.__file__), "selectors.py")


class LoopWatchdog:
    """Watch the running loop from a thread of its own: `start()` in the loop, `stop()`
    when done."""

    def __init__(self, blocked_s: float = BLOCKED_S) -> None:
        self.blocked_s = blocked_s
        self._beat = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop_thread = 0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._beat = time.monotonic()
        self._thread = threading.Thread(target=self._watch, name="loop watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _pong(self) -> None:
        self._beat = time.monotonic()

    def _watch(self) -> None:
        assert self._loop is not None
        while not self._stop.wait(BEAT_S):
            beat = self._beat
            try:
                self._loop.call_soon_threadsafe(self._pong)  # answered at the loop's next turn
            except RuntimeError:
                return  # the loop is closed
            if time.monotonic() - beat <= self.blocked_s + BEAT_S:
                continue
            where = self._where()
            if where is None:
                continue  # waiting in select, not blocked: a busy machine starved it
            said_still = False
            while self._beat == beat and not self._stop.wait(BEAT_S / 5):
                where = where or self._where()
                if not said_still and time.monotonic() - beat > STILL_BLOCKED_S:
                    said_still = True
                    log.error("event loop blocked for %.0f s so far in %s", STILL_BLOCKED_S, where)
            if self._beat != beat:
                held = self._beat - beat - BEAT_S
                log.warning(
                    "event loop blocked for %.1f s in %s: every resource of this process "
                    "waited; do blocking work in a thread (asyncio.to_thread)",
                    held,
                    where,
                )

    def _where(self) -> str | None:
        """The hook the loop thread is in now ('example.com/a: Widgets.allocate (w.py:42)'),
        else its innermost frame outside asyncio; None when it waits in select."""
        frame = sys._current_frames().get(self._loop_thread)
        if frame is None or frame.f_code.co_filename == _SELECTORS:
            return None
        inner = _innermost_own(frame)
        place = f"{inner.f_code.co_filename}:{inner.f_lineno}" if inner else "?"
        hook = _hook(frame)
        if hook is None:
            return f"{inner.f_code.co_name if inner else '?'} ({place})"
        return f"{hook} ({place})"


def _innermost_own(frame: FrameType | None) -> FrameType | None:
    """The innermost frame that is not asyncio's own."""
    while frame is not None and frame.f_code.co_filename.startswith(_ASYNCIO):
        frame = frame.f_back
    return frame


def _hook(frame: FrameType | None) -> str | None:
    """'<resource>: <Class>.<method>' of the innermost frame running a method of a
    Plugin: the hook."""
    from devplug.framework.plugin import Plugin

    while frame is not None:
        owner = frame.f_locals.get("self") if frame.f_code.co_varnames[:1] == ("self",) else None
        if isinstance(owner, Plugin):
            return f"{owner.resource_name}: {type(owner).__name__}.{frame.f_code.co_name}"
        frame = frame.f_back
    return None
