"""The health thread: NVML's critical Xid events and a periodic 'are you there' per GPU.

NVML's event wait blocks, so it runs on a thread of its own and hands what it sees to
the event loop (`report`, called on the thread: it must be thread-safe, such as
`loop.call_soon_threadsafe`). The loop never waits for this thread; a `Round` report
after each probe round lets it notice when NVML stops answering altogether.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from devplug.sources.nvidia.nvml import Nvml, XidEvent

log = logging.getLogger("devplug.sources.nvidia")

WAIT_SLICE_MS = 250  # the longest single event wait: how soon a stop is seen


@dataclass(frozen=True, slots=True)
class Probe:
    index: int
    error: str  # empty: the GPU answered


@dataclass(frozen=True, slots=True)
class Round:
    """A probe round finished (every GPU answered or failed)."""


Report = XidEvent | Probe | Round


class HealthThread:
    def __init__(
        self,
        nvml: Nvml,
        events: Any,
        gpus: Sequence[int],
        probe_seconds: float,
        report: Callable[[Report], None],
    ) -> None:
        self.nvml = nvml
        self.events = events
        self.gpus = list(gpus)
        self.probe_seconds = probe_seconds
        self.report = report
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml health", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end after its current wait; does not wait for it."""
        self._stop.set()

    def join(self) -> None:
        """Block until the thread has ended (its event set freed)."""
        self._thread.join()

    def _run(self) -> None:
        next_probe = time.monotonic()
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_probe:
                    self._probe_all()
                    next_probe = time.monotonic() + self.probe_seconds
                    continue
                wait_ms = max(1, min(WAIT_SLICE_MS, int((next_probe - now) * 1000)))
                event: XidEvent | None = None
                if self.events is None:
                    self._stop.wait(wait_ms / 1000)
                    continue
                try:
                    event = self.nvml.wait_xid(self.events, wait_ms)
                except self.nvml.Error as error:
                    # GpuIsLost and friends: see which GPU at once.
                    log.debug("NVML event wait failed: %s", error)
                    next_probe = time.monotonic()
                    self._stop.wait(min(self.probe_seconds, 0.1))
                if event is not None:
                    self.report(event)
        finally:
            if self.events is not None:
                self.nvml.free(self.events)

    def _probe_all(self) -> None:
        for index in self.gpus:
            try:
                self.nvml.probe(index)
            except self.nvml.Error as error:
                self.report(Probe(index, f"{type(error).__name__}: {error}"))
            else:
                self.report(Probe(index, ""))
        self.report(Round())
