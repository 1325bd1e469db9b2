"""The health thread: NVML's critical Xid and double-bit ECC events, and a periodic
'are you there' per GPU.

NVML's event wait blocks, so it runs on a thread of its own and hands what it sees to
the event loop (`report`, called on the thread: it must be thread-safe, such as
`loop.call_soon_threadsafe`). The loop never waits for this thread; a `Round` report
after each probe round lets it notice when NVML stops answering altogether. When the
wait itself fails (GpuIsLost: a GPU of the set fell off the bus), the thread says so
(`WaitFailed`), probes every GPU at once and watches the ones that answer on a new
event set (`Rewatched`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from devplug.sources.nvidia.nvml import RECOVERY_NONE, Nvml, XidEvent

log = logging.getLogger("devplug.sources.nvidia")

WAIT_SLICE_MS = 250  # the longest single event wait: how soon a stop is seen


@dataclass(frozen=True, slots=True)
class Probe:
    index: int
    error: str  # empty: the GPU answered
    recovery_action: int = RECOVERY_NONE  # what the driver asks for (NVML_GPU_RECOVERY_ACTION_*)


@dataclass(frozen=True, slots=True)
class Round:
    """A probe round finished (every GPU answered or failed)."""


@dataclass(frozen=True, slots=True)
class WaitFailed:
    """The event wait failed: no Xid can be seen until the GPUs are watched again."""

    error: str


@dataclass(frozen=True, slots=True)
class Rewatched:
    """Watched again on a new event set, without the GPUs in `unwatched`."""

    unwatched: tuple[int, ...]


Report = XidEvent | Probe | Round | WaitFailed | Rewatched


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
        self._lost: list[int] = []
        self._blind = False  # a wait failed; no wait on a new event set succeeded yet
        self._unwatched: tuple[int, ...] = ()
        self._skipped: tuple[int, ...] = ()  # lost GPUs the event set was made without
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
                    back = set(self._skipped) - set(self._lost)
                    if (self._blind and self.events is None) or back:
                        self._watch_again()  # again, or with the GPUs that came back
                    next_probe = time.monotonic() + self.probe_seconds
                    continue
                wait_ms = max(1, min(WAIT_SLICE_MS, int((next_probe - now) * 1000)))
                if self.events is None:
                    self._stop.wait(wait_ms / 1000)
                    continue
                try:
                    event = self.nvml.wait_event(self.events, wait_ms)
                except self.nvml.Error as error:
                    self._rewatch(f"{type(error).__name__}: {error}")
                    next_probe = time.monotonic() + self.probe_seconds
                    continue
                if self._blind:  # the new event set works
                    self._blind = False
                    self.report(Rewatched(self._unwatched))
                if event is not None:
                    self.report(event)
        finally:
            if self.events is not None:
                self.nvml.free(self.events)

    def _rewatch(self, error: str) -> None:
        """After a failed wait: say so (once while blind), find the GPUs that still
        answer, watch those on a new event set."""
        log.debug("NVML event wait failed: %s", error)
        if not self._blind:
            self.report(WaitFailed(error))
        self._blind = True
        self.nvml.free(self.events)
        self.events = None
        self._probe_all()
        self._watch_again()

    def _watch_again(self) -> None:
        """A new event set for the GPUs that answered the last probe round (tried again
        after each round until it can be made)."""
        try:
            events, unwatched = self.nvml.watch_events(skip=self._lost)
        except self.nvml.Error as error:
            log.debug("NVML events cannot be watched again: %s", error)
            return
        if self.events is not None:
            self.nvml.free(self.events)
        self.events, self._skipped = events, tuple(self._lost)
        self._unwatched = tuple(sorted(set(unwatched) | set(self._lost)))

    def _probe_all(self) -> None:
        lost = []
        for index in self.gpus:
            try:
                action = self.nvml.probe(index)
            except self.nvml.Error as error:
                lost.append(index)
                self.report(Probe(index, f"{type(error).__name__}: {error}"))
            else:
                self.report(Probe(index, "", action))
        self._lost = lost
        self.report(Round())
