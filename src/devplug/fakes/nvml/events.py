"""Event sets through the fake NVML: XID and ECC events of the description, waited
for as the driver's event sets are."""

from __future__ import annotations

import ctypes
import time
from typing import Any

import pynvml as _real

from devplug.fakes.nvml.driver import (
    ALL_EVENTS,
    ALL_INSTANCES,
    EVENT_TYPES,
    POLL_S,
    NVMLError_GpuIsLost,
    NVMLError_InvalidArgument,
    NVMLError_NotSupported,
    NVMLError_Timeout,
    _address,
    _error,
    _event_sets,
    _handle,
    _initialized,
    _key,
    _lock,
    _target,
)

# -- events ----------------------------------------------------------------------------------


def nvmlEventSetCreate() -> Any:
    description = _initialized()
    target = _real.struct_c_nvmlEventSet_t()
    with _lock:
        _event_sets[ctypes.addressof(target)] = {
            "target": target,
            "gpus": {},  # GPU index -> registered event types
            "next": len(description.get("events", [])),  # only events from now on
        }
    return ctypes.pointer(target)


def _event_set(events: Any) -> dict[str, Any]:
    address = _address(events)
    if address not in _event_sets:
        raise NVMLError_InvalidArgument()
    return _event_sets[address]


def _supported_events(entry: dict[str, Any]) -> int:
    events = entry.get("events", True)
    if events is True:
        return int(ALL_EVENTS)
    if not events:
        return 0
    return int(sum(EVENT_TYPES[name] for name in events))


def nvmlDeviceGetSupportedEventTypes(handle: Any) -> int:
    _, entry, _ = _target(handle)
    return _supported_events(entry)


def nvmlDeviceRegisterEvents(handle: Any, eventTypes: int, eventSet: Any) -> None:
    """NotSupported when the GPU does not support some of the requested event types."""
    _, entry, _ = _target(handle)
    supported = _supported_events(entry)
    if not supported or int(eventTypes) & ~supported:
        raise NVMLError_NotSupported()
    with _lock:
        registered = _event_set(eventSet)["gpus"]
        index = _key(handle)[1]
        registered[index] = registered.get(index, 0) | int(eventTypes)


def nvmlEventSetWait_v2(eventSet: Any, timeoutms: int) -> Any:
    """The next registered event; Timeout after `timeoutms`; GpuIsLost when a GPU of the
    set fell off the bus, or the driver's 'waitError'."""
    deadline = time.monotonic() + timeoutms / 1000
    while True:
        description = _initialized()
        with _lock:
            state = _event_set(eventSet)
            wait_error = description.get("driver", {}).get("waitError")
            if wait_error:
                raise _error(wait_error)
            for index in state["gpus"]:
                if index >= len(description["gpus"]) or description["gpus"][index].get("lost"):
                    raise NVMLError_GpuIsLost()
            events = description.get("events", [])
            while state["next"] < len(events):
                event = events[state["next"]]
                state["next"] += 1
                kind = EVENT_TYPES[event.get("type", "xid")]
                if not state["gpus"].get(event["gpu"], 0) & kind:
                    continue
                data = _real.c_nvmlEventData_t()
                data.device = _handle(("gpu", event["gpu"]))
                data.eventType = kind
                data.eventData = int(event.get("xid") or 0)
                gi, ci = event.get("gi"), event.get("ci")
                data.gpuInstanceId = ALL_INSTANCES if gi is None else int(gi)
                data.computeInstanceId = ALL_INSTANCES if ci is None else int(ci)
                return data
        if time.monotonic() >= deadline:
            raise NVMLError_Timeout()
        time.sleep(POLL_S)


def nvmlEventSetFree(eventSet: Any) -> None:
    with _lock:
        if _event_sets.pop(_address(eventSet), None) is None:
            raise NVMLError_InvalidArgument()
