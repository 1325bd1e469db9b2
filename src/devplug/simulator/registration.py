"""The kubelet's Registration service: the checks it makes before it dials a plugin back.

Refusals are plain errors for the plugin (gRPC status UNKNOWN, as a Go error returned
from a handler becomes) with the kubelet's messages:

- `requested API version "v1" is not supported by kubelet. Supported version is ["v1beta1"]`
- `the ResourceName "foo" is invalid`
- `failed to dial device plugin: ...` when the endpoint cannot be reached
- `failed to get device plugin options: ...` when GetDevicePluginOptions fails
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import grpc

from devplug.api.constants import SUPPORTED_VERSIONS
from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.framework.names import resource_name_problem

log = logging.getLogger("devplug.simulator.registration")


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
