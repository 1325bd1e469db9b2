"""The kubelet's Registration service: the checks it makes before it dials a plugin back.

Refusals are plain errors for the plugin (gRPC status UNKNOWN, as a Go error returned
from a handler becomes) with the kubelet's messages:

- `requested API version "v1" is not supported by kubelet. Supported version is ["v1beta1"]`
- `the ResourceName "foo" is invalid`
- `failed to dial device plugin: ...` when the endpoint cannot be reached
- `failed to get device plugin options: ...` when GetDevicePluginOptions fails
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import grpc

from devplug.api.constants import SUPPORTED_VERSIONS
from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.kube.names import resource_name_problem
from devplug.simulator.endpoint import EndpointError
from devplug.simulator.events import REGISTERED, REGISTRATION_REFUSED

log = logging.getLogger("devplug.simulator.registration")
kubelet_log = logging.getLogger("devplug.simulator.kubelet")


class RegistrationRefused(Exception):
    """Register fails with this message."""


def go_quote(text: str) -> str:
    """Go's %q for ordinary strings."""
    return json.dumps(text, ensure_ascii=False)


def go_quote_list(items: Sequence[str]) -> str:
    """Go's %q for a []string: ["a" "b"]."""
    return "[" + " ".join(go_quote(i) for i in items) + "]"


def request_problem(request: pb.RegisterRequest, plugin_dir: Path) -> str | None:
    """Why the kubelet refuses `request` before dialing the plugin, or None."""
    if request.version not in SUPPORTED_VERSIONS:
        return (
            f"requested API version {go_quote(request.version)} is not supported by kubelet. "
            f"Supported version is {go_quote_list(SUPPORTED_VERSIONS)}"
        )
    problem = resource_name_problem(request.resource_name)
    if problem is not None:
        log.info("invalid resource name %s", problem)
        return f"the ResourceName {go_quote(request.resource_name)} is invalid"
    endpoint = request.endpoint
    if not endpoint or "/" in endpoint or endpoint in (".", "..") or "\0" in endpoint:
        return (
            f"failed to dial device plugin: the endpoint {go_quote(endpoint)} is not the "
            f"name of a socket in {plugin_dir}"
        )
    return None


RegisterHandler = Callable[[pb.RegisterRequest], Awaitable[None]]


class RegistrationServicer(pb_grpc.RegistrationServicer):
    def __init__(self, handler: RegisterHandler) -> None:
        self._handler = handler

    async def Register(
        self,
        request: pb.RegisterRequest,
        context: grpc.aio.ServicerContext[pb.RegisterRequest, pb.Empty],
    ) -> pb.Empty:
        try:
            await self._handler(request)
        except RegistrationRefused as refusal:
            await context.abort(grpc.StatusCode.UNKNOWN, str(refusal))
        return pb.Empty()


# Dial `resource`'s plugin at a socket path, or raise EndpointError; None when the
# kubelet is not running.
Dialer = Callable[[], Callable[[str, Path], Awaitable[object]] | None]
Emit = Callable[[str, str, str], None]


class Registrar:
    """The kubelet's side of Register: checks a request, dials the plugin back (one
    registration of a resource at a time), and counts requests and registrations.

    `dialer()` gives the running device manager's `register`, or None when the kubelet
    is not running; `emit(kind, resource, detail)` records an event.
    """

    def __init__(self, plugin_dir: Path, dialer: Dialer, emit: Emit) -> None:
        self.plugin_dir = plugin_dir
        self._dialer = dialer
        self._emit = emit
        # Register calls per resource (the kubelet counts every request, refused ones too).
        self.total: collections.Counter[str] = collections.Counter()
        # Successful registrations per resource (DRA drivers' too).
        self.done: collections.Counter[str] = collections.Counter()
        self._locks: dict[str, asyncio.Lock] = {}
        # The plugin sockets that registered with this simulator: what a restart removes.
        self.plugin_sockets: set[Path] = set()

    def _refuse(self, resource: str, message: str) -> RegistrationRefused:
        kubelet_log.warning("registration of %r refused: %s", resource, message)
        self._emit(REGISTRATION_REFUSED, resource, message)
        return RegistrationRefused(message)

    async def register(self, request: pb.RegisterRequest) -> None:
        """Handle one Register request; RegistrationRefused says why it failed."""
        resource = request.resource_name
        # The kubelet counts every request, before it checks it.
        self.total[resource] += 1
        kubelet_log.info(
            "Got registration request from device plugin with resource %s (endpoint %s)",
            resource,
            request.endpoint,
        )
        problem = request_problem(request, self.plugin_dir)
        if problem is not None:
            raise self._refuse(resource, problem)
        dial = self._dialer()
        if dial is None:
            raise self._refuse(resource, "the kubelet is not running")
        lock = self._locks.setdefault(resource, asyncio.Lock())
        async with lock:
            try:
                await dial(resource, self.plugin_dir / request.endpoint)
            except EndpointError as error:
                raise self._refuse(resource, str(error)) from None
        self.done[resource] += 1
        self.plugin_sockets.add(self.plugin_dir / request.endpoint)
        kubelet_log.info("%s: registered, endpoint %s", resource, request.endpoint)
        self._emit(REGISTERED, resource, request.endpoint)
