"""The one backoff between attempts to reach the API server.

Each wait is drawn at random between half and all of the current step, and the step
doubles up to a ceiling: after an outage, a thousand DaemonSet pods (or a fleet's
thousand nodes) that failed together come back spread over the step instead of all in
the same millisecond.
"""

from __future__ import annotations

import random
import time

CONNECT_TIMEOUT_S = 10.0  # connecting (TCP and TLS) to the API server
READ_TIMEOUT_S = 30.0  # waiting for an answer to a request that is not a watch
WATCH_MARGIN_S = 30.0  # a watch's read timeout: its timeoutSeconds and this


class Backoff:
    """Exponential backoff with jitter: `next()` is the wait before the next attempt,
    `reset()` after a success."""

    def __init__(self, first: float, most: float, *, rng: random.Random | None = None) -> None:
        if not 0 < first <= most:
            raise ValueError(f"backoff: need 0 < first ({first}) <= most ({most})")
        self.first = first
        self.most = most
        self.step = first
        self.attempts = 0  # failures since the last success
        self._rng = rng or random.Random()

    def next(self) -> float:
        """The wait before the next attempt, in [step/2, step]; the step then doubles."""
        wait = self._rng.uniform(self.step / 2, self.step)
        self.step = min(self.step * 2, self.most)
        self.attempts += 1
        return wait

    def reset(self) -> None:
        self.step = self.first
        self.attempts = 0


class Deadline:
    """The end of a wait that must end: `left()` seconds remain (never below 0)."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self._end = None if seconds is None else time.monotonic() + seconds

    def left(self) -> float | None:
        """Seconds left; None: no deadline."""
        return None if self._end is None else max(0.0, self._end - time.monotonic())

    def passed(self) -> bool:
        left = self.left()
        return left is not None and left <= 0
