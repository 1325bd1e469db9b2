"""The `limits:` block of the config file: bounds on requests, devices and streams.

Every field has a safe default (devplug.config.limitdefaults, the framework's too); a
config only names the ones it changes, within a range that still protects the daemon.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

import msgspec

from devplug.config.limitdefaults import (
    DEFAULT_MAX_DEVICES,
    DEFAULT_MAX_IDS_PER_REQUEST,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_STREAMS,
    DEFAULT_REGISTER_TIMEOUT_S,
)

# (field, lowest, highest): beyond these a limit no longer protects anything.
RANGES: dict[str, tuple[float, float]] = {
    "maxRequestBytes": (1024, 64 * 1024 * 1024),
    "maxDevicesPerResource": (1, 1_000_000),
    "maxIdsPerRequest": (1, 1_000_000),
    "maxStreams": (1, 1024),
    "registerTimeoutSeconds": (0.1, 600),
}


class LimitsSpec(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_devices_per_resource: int = DEFAULT_MAX_DEVICES
    max_ids_per_request: int = DEFAULT_MAX_IDS_PER_REQUEST
    max_streams: int = DEFAULT_MAX_STREAMS
    register_timeout_seconds: float = DEFAULT_REGISTER_TIMEOUT_S


def check_limits(spec: LimitsSpec, fail: Callable[[str, str], NoReturn]) -> None:
    values = msgspec.to_builtins(spec)
    for field, (low, high) in RANGES.items():
        value = values[field]
        if not low <= value <= high:
            fail(f"limits.{field}", f"expected a value from {low:g} to {high:g}, got {value:g}")
