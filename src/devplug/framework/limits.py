"""Bounds on what one plugin accepts from its clients and from its own discovery.

The kubelet is the only expected client, but the socket is reachable by any local root
process, so every input is bounded: a request past a limit is refused with
RESOURCE_EXHAUSTED and a message naming the limit, and the daemon keeps serving.
"""

from __future__ import annotations

from typing import NamedTuple

from devplug.config.limitdefaults import (
    DEFAULT_MAX_DEVICES,
    DEFAULT_MAX_IDS_PER_REQUEST,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_STREAMS,
    DEFAULT_REGISTER_TIMEOUT_S,
)


class Limits(NamedTuple):
    """`max_request_bytes`: largest request message; `max_devices`: devices one
    resource publishes (the rest are left out, with an error in the log);
    `max_ids_per_request`: device IDs in one Allocate / GetPreferredAllocation /
    PreStartContainer request, all containers together; `max_streams`: ListAndWatch
    streams open at once; `register_timeout_s`: one Register call. (A NamedTuple: a
    fifth of a frozen dataclass's cost to define, paid at every daemon's start.)"""

    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_devices: int = DEFAULT_MAX_DEVICES
    max_ids_per_request: int = DEFAULT_MAX_IDS_PER_REQUEST
    max_streams: int = DEFAULT_MAX_STREAMS
    register_timeout_s: float = DEFAULT_REGISTER_TIMEOUT_S

    def server_options(self) -> list[tuple[str, int]]:
        """gRPC server options that enforce the request size (gRPC answers
        RESOURCE_EXHAUSTED before our code sees the message)."""
        return [("grpc.max_receive_message_length", self.max_request_bytes)]


def device_limit_problem(resource: str, found: int, limits: Limits) -> str | None:
    """The line said when a resource finds more devices than it may publish (the first
    `max_devices` are served): by the daemon when it publishes, by `devplug check`."""
    if found <= limits.max_devices:
        return None
    return (
        f"{resource}: {found} devices, more than the limit of {limits.max_devices} "
        f"(limits.maxDevicesPerResource): serving the first {limits.max_devices}"
    )
