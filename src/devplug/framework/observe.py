"""What the framework tells operators: one event per thing that happened, seen by every
observer (the log by default; metrics when the daemon serves them).

The framework calls `emit` where something happens (a registration, an allocation, a
refusal...); observers never reach into the framework's state. Each event is one log
line at the level it carries, with its fields as structured data for JSON logs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

log = logging.getLogger("devplug.events")

# Event kinds (the `event` field of a JSON log line).
REGISTERED = "registered"  # fields: ms, devices, again (bool), kubelet_restart (bool)
REGISTRATION_FAILED = "registration_failed"  # fields: code, retry_s
KUBELET_GONE = "kubelet_gone"
SOCKET_GONE = "socket_gone"
HEALTH_CHANGED = "health_changed"  # fields: unhealthy, healthy (lists of device IDs)
ALLOCATED = "allocated"  # fields: containers (list of ID lists), seconds
REFUSED = "refused"  # fields: method, code, seconds (Allocate only)
STREAM_OPENED = "stream_opened"
STREAM_CLOSED = "stream_closed"
RELOADED = "reloaded"  # fields: added, removed, changed, kept (resource names), settings (keys)
RELOAD_REFUSED = "reload_refused"  # fields: error
# DRA (the resource is the driver's name); `result` is "ok" or "error".
CLAIM_PREPARED = "claim_prepared"  # fields: claim, result, seconds
CLAIM_UNPREPARED = "claim_unprepared"  # fields: claim, result, seconds
SLICES_PUBLISHED = "slices_published"  # fields: result
CLAIM_STATUS_WRITTEN = "claim_status_written"  # fields: claim, result
XID = "xid"  # fields: gpu (UUID), xid, action (ignore/transient/reset)
# A share given against the scheduler extender's choice: fields: result (PLACEMENTS)
PLACED = "placed"
# followed: the extender's GPU given; unmatched: no pod waiting with the extender's
# choice for this request (served by the resource's own policy); refused: the kubelet
# allocated another GPU than the extender chose (Allocate refused).
PLACEMENTS = ("followed", "unmatched", "refused")
RESULTS = ("ok", "error")


class Event(NamedTuple):
    """One thing that happened to a resource. (A NamedTuple: a fifth of a frozen
    dataclass's cost to define, paid at every daemon's start.)"""

    kind: str
    resource: str
    message: str
    level: int = logging.INFO
    fields: Mapping[str, Any] = MappingProxyType({})


Observer = Callable[[Event], None]


def log_event(event: Event) -> None:
    """The default observer: one line, `resource: message`, fields as `extra`."""
    if not log.isEnabledFor(event.level):
        return
    prefix = f"{event.resource}: " if event.resource else ""
    log.log(
        event.level,
        "%s%s",
        prefix,
        event.message,
        extra={"event": event.kind, "resource": event.resource, **event.fields},
    )


_observers: list[Observer] = [log_event]


def add_observer(observer: Observer) -> None:
    """Call `observer` with every event, before the log line is written: a line seen
    in the log means every observer has seen its event."""
    if observer not in _observers:
        _observers.insert(0, observer)


def remove_observer(observer: Observer) -> None:
    if observer in _observers:
        _observers.remove(observer)


def heard(level: int = logging.INFO) -> bool:
    """Whether an event at `level` reaches anyone: an observer besides the log, or a
    log that writes `level`. A hot path asks before it builds an event's message."""
    return len(_observers) != 1 or _observers[0] is not log_event or log.isEnabledFor(level)


def emit(kind: str, resource: str, message: str, level: int = logging.INFO, **fields: Any) -> None:
    """Tell every observer; an observer that fails is logged, never raised into the
    framework (a broken metric must not refuse an Allocate)."""
    if not heard(level):
        return
    event = Event(kind, resource, message, level, fields)
    for observer in list(_observers):
        try:
            observer(event)
        except Exception:
            log.exception("observer %r failed on %s", observer, kind)


def show_ids(ids: Sequence[str], limit: int = 10) -> str:
    """IDs for a log line: the first `limit`, then how many more."""
    shown = ", ".join(ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")
