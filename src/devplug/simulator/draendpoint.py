"""The kubelet's seam to one DRA driver: NodePrepareResources and
NodeUnprepareResources of one claim, over gRPC to the driver's socket
(`GrpcDraEndpoint`), or to a driver object in the same process (the fleet's
`LocalDraEndpoint`), as device plugins have `Endpoint` and `LocalEndpoint`.

Either side answers with the same words: a claim the driver refuses is
`<driver>: claim <namespace>/<name>: <its error>`, as the kubelet reports the error
field of the driver's answer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import grpc

from devplug.framework.dra.driver import ClaimRef
from devplug.simulator.draplugins import CALL_TIMEOUT_S
from devplug.simulator.results import REASON_FAILED_PREPARE


class PrepareError(Exception):
    """A claim of the pod could not be prepared (the kubelet's FailedPrepareDynamicResources),
    or (`reason` Unschedulable) could never have been allocated so."""

    def __init__(self, message: str, reason: str = REASON_FAILED_PREPARE) -> None:
        super().__init__(message)
        self.reason = reason


# CDI device IDs by request name ("" for devices of every request).
CdiByRequest = dict[str, list[str]]


def refused(driver: str, claim: ClaimRef, error: str) -> PrepareError:
    """The driver's error for one claim, worded as the kubelet words it."""
    return PrepareError(f"{driver}: claim {claim.namespace}/{claim.name}: {error}")


def add_devices(by_request: CdiByRequest, requests: list[str], cdi_ids: list[str]) -> None:
    """One prepared device's CDI IDs, under each request it serves ("" for none)."""
    for request in requests or [""]:
        by_request.setdefault(request, []).extend(cdi_ids)


class DraEndpoint(ABC):
    """One registered DRA driver, as the kubelet's DRA manager calls it."""

    def __init__(self, name: str) -> None:
        self.name = name

    @abstractmethod
    async def prepare(self, claim: ClaimRef) -> CdiByRequest:
        """NodePrepareResources of `claim`: its CDI devices by request; PrepareError
        says why not."""

    @abstractmethod
    async def unprepare(self, claim: ClaimRef) -> None:
        """NodeUnprepareResources of `claim`; PrepareError says why it failed."""


class GrpcDraEndpoint(DraEndpoint):
    """A driver on its socket: `pb` the messages of the DRA service version it speaks,
    `stub` its DRAPlugin stub."""

    def __init__(self, name: str, pb: Any, stub: Any) -> None:
        super().__init__(name)
        self.pb = pb
        self.stub = stub

    def _claims(self, claim: ClaimRef) -> list[Any]:
        """The one claim of a request, as the kubelet sends it."""
        return [self.pb.Claim(namespace=claim.namespace, uid=claim.uid, name=claim.name)]

    async def prepare(self, claim: ClaimRef) -> CdiByRequest:
        try:
            response = await self.stub.NodePrepareResources(
                self.pb.NodePrepareResourcesRequest(claims=self._claims(claim)),
                timeout=CALL_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as error:
            raise PrepareError(
                f"NodePrepareResources of {self.name} failed: "
                f"{error.code().name}: {error.details()}"
            ) from None
        if claim.uid not in response.claims:
            raise PrepareError(f"{self.name} did not answer for claim {claim.name}")
        answer = response.claims[claim.uid]
        if answer.error:
            raise refused(self.name, claim, answer.error)
        by_request: CdiByRequest = {}
        for device in answer.devices:
            add_devices(by_request, list(device.request_names), list(device.cdi_device_ids))
        return by_request

    async def unprepare(self, claim: ClaimRef) -> None:
        try:
            response = await self.stub.NodeUnprepareResources(
                self.pb.NodeUnprepareResourcesRequest(claims=self._claims(claim)),
                timeout=CALL_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as error:
            raise PrepareError(
                f"NodeUnprepareResources of {self.name} failed: {error.details()}"
            ) from None
        answer = response.claims.get(claim.uid)
        if answer is not None and answer.error:
            raise PrepareError(f"{self.name}: unprepare of {claim.name}: {answer.error}")
