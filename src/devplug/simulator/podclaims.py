"""The claims of a node's pods, prepared through the drivers their allocation names:
the kubelet's DRA manager without its plugin watcher, written once for the simulated
kubelet (drivers on sockets) and the fleet (drivers in the process).

    claims = PodClaims(read_claim, endpoint_of)
    cdi = await claims.prepare_pod(pod)     # {container: [CDI device IDs]}
    await claims.unprepare_pod(pod.uid)

A claim is prepared once, whichever pods use it, and unprepared when its last pod
goes. Each driver named in the claim's allocation is called, unless all of its
devices skip the call (`skipNodeOperations`); a driver that is not registered fails
the claim.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import msgspec

from devplug.framework.dra.claims import ClaimError
from devplug.framework.dra.driver import ClaimRef
from devplug.simulator.draendpoint import DraEndpoint, PrepareError
from devplug.simulator.pods import PodSpec, dra_backed_resources

log = logging.getLogger("devplug.simulator.dra")

# The pod claim name under which the claim the scheduler made for a pod's extended
# resources is known here (no real pod claim can have it: not a DNS label).
EXTENDED_CLAIM = "<extended-resources>"

PREPARE = "NodePrepareResources"
UNPREPARE = "NodeUnprepareResources"


class PreparedClaimState(msgspec.Struct):
    namespace: str
    name: str
    uid: str
    # driver -> CDI device IDs by request name ("" for devices of every request)
    cdi: dict[str, dict[str, list[str]]] = {}
    pods: list[str] = []
    # The allocation results, to check the claims that come after it.
    results: list[dict[str, Any]] = []


class State(msgspec.Struct):
    claims: dict[str, PreparedClaimState] = {}


# The claim object of a reference (ClaimError: none such).
ReadClaim = Callable[[ClaimRef], Awaitable[Mapping[str, Any]]]
# The registered driver of a name, None where none is.
EndpointOf = Callable[[str], DraEndpoint | None]
# Checks a claim's allocation against the claims prepared before (PrepareError).
CheckAllocation = Callable[[str, list[dict[str, Any]], State], None]


def skips(results: Sequence[Mapping[str, Any]], driver: str, operation: str) -> bool:
    """Whether every allocated device of `driver` skips `operation` (its slice's
    `skipNodeOperations`, copied into the allocation: Kubernetes 1.37, alpha), so that
    the kubelet makes no call to the driver for it."""
    mine = [r for r in results if r.get("driver") == driver]
    return bool(mine) and all(
        {operation, "*"} & set(r.get("skipNodeOperations") or ()) for r in mine
    )


def claim_drivers(results: Sequence[Mapping[str, Any]], operation: str) -> list[str]:
    """The drivers the kubelet calls for `operation` of a claim allocated `results`:
    each driver named there, but those whose devices all skip it."""
    named = sorted({str(r.get("driver")) for r in results})
    return [name for name in named if not skips(results, name, operation)]


def pod_claims(pod: PodSpec) -> dict[str, str]:
    """Pod claim name -> ResourceClaim name, from spec.resourceClaims (direct names,
    or generated ones from status.resourceClaimStatuses), and the claim of the pod's
    extended resources served through DRA (status.extendedResourceClaimStatus)."""
    spec = pod.manifest.get("spec") or {}
    status = pod.manifest.get("status") or {}
    extended = status.get("extendedResourceClaimStatus")
    if not extended and not spec.get("resourceClaims"):
        return {}  # most pods
    if isinstance(extended, Mapping) and extended.get("resourceClaimName"):
        made = {EXTENDED_CLAIM: str(extended["resourceClaimName"])}
    else:
        made = {}
    generated = {
        s.get("name"): s.get("resourceClaimName")
        for s in status.get("resourceClaimStatuses") or []
        if isinstance(s, Mapping)
    }
    result: dict[str, str] = {}
    for entry in spec.get("resourceClaims") or []:
        if not isinstance(entry, Mapping) or not entry.get("name"):
            continue
        name = entry.get("resourceClaimName") or generated.get(entry["name"])
        if name:
            result[str(entry["name"])] = str(name)
    return {**result, **made}


def container_claims(pod: PodSpec) -> dict[str, list[tuple[str, str]]]:
    """Container -> [(pod claim name, request or '')], from resources.claims."""
    spec = pod.manifest.get("spec") or {}
    result: dict[str, list[tuple[str, str]]] = {}
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or []:
            if not isinstance(container, Mapping):
                continue
            resources = container.get("resources") or {}
            claims = resources.get("claims") if isinstance(resources, Mapping) else None
            result[str(container.get("name"))] = [
                (str(c.get("name")), str(c.get("request") or ""))
                for c in claims or []
                if isinstance(c, Mapping)
            ]
    # Counted extended resources served through DRA: each container gets its request
    # of the scheduler's claim.
    for (container_name, _), request in dra_backed_resources(pod.manifest).items():
        result.setdefault(container_name, []).append((EXTENDED_CLAIM, request))
    return result


def _container_cdi(pod: PodSpec, claims: Mapping[str, PreparedClaimState]) -> dict[str, list[str]]:
    result: dict[str, list[str]] = {}
    if not claims:
        return result
    for container, refs in container_claims(pod).items():
        ids: dict[str, None] = {}
        for pod_claim, request in refs:
            state = claims.get(pod_claim)
            for by_request in (state.cdi if state is not None else {}).values():
                for req, cdi_ids in by_request.items():
                    if not request or req in ("", request) or req.startswith(f"{request}/"):
                        ids.update(dict.fromkeys(cdi_ids))
        if ids:
            result[container] = list(ids)
    return result


class PodClaims:
    """The prepared claims of a node and the pods using each.

    `read_claim` gives a claim's object; `endpoint_of` the registered driver of a
    name. `on_change` is called after each change of `state` (to keep it on disk);
    `check` checks an allocation no scheduler made."""

    def __init__(
        self,
        read_claim: ReadClaim,
        endpoint_of: EndpointOf,
        *,
        state: State | None = None,
        on_change: Callable[[], None] | None = None,
        check: CheckAllocation | None = None,
    ) -> None:
        self.read_claim = read_claim
        self.endpoint_of = endpoint_of
        self.state = state if state is not None else State()
        self._on_change = on_change
        self._check = check

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    async def prepare_pod(self, pod: PodSpec) -> dict[str, list[str]]:
        """Prepare the pod's claims; the CDI device IDs of each container. A claim
        that fails leaves those before it prepared for the pod (`unprepare_pod`
        releases them)."""
        claims: dict[str, PreparedClaimState] = {}
        for pod_claim, claim_name in pod_claims(pod).items():
            claims[pod_claim] = await self._prepare_claim(pod, claim_name)
        return _container_cdi(pod, claims)

    def container_cdi(self, pod: PodSpec) -> dict[str, list[str]]:
        """The CDI device IDs of each container of a pod whose claims are prepared."""
        by_name = {(c.namespace, c.name): c for c in self.state.claims.values()}
        claims = {
            pod_claim: by_name[(pod.namespace, claim_name)]
            for pod_claim, claim_name in pod_claims(pod).items()
            if (pod.namespace, claim_name) in by_name
        }
        return _container_cdi(pod, claims)

    async def _prepare_claim(self, pod: PodSpec, claim_name: str) -> PreparedClaimState:
        try:
            obj = await self.read_claim(ClaimRef(pod.namespace, claim_name, ""))
        except ClaimError as error:
            raise PrepareError(str(error)) from None
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        known = self.state.claims.get(uid)
        if known is not None:
            if pod.uid not in known.pods:
                known.pods.append(pod.uid)
                self._changed()
            return known
        allocation = (obj.get("status") or {}).get("allocation")
        if not allocation:
            raise PrepareError(f"ResourceClaim {pod.namespace}/{claim_name} is not allocated")
        results = (allocation.get("devices") or {}).get("results") or []
        if self._check is not None:
            self._check(f"{pod.namespace}/{claim_name}", results, self.state)
        state = PreparedClaimState(
            pod.namespace, claim_name, uid, pods=[pod.uid], results=list(results)
        )
        ref = ClaimRef(pod.namespace, claim_name, uid)
        for name in claim_drivers(results, PREPARE):
            # (as a 1.37 kubelet with DRAOptionalNodeOperations: one skipped is not
            # even looked up)
            endpoint = self.endpoint_of(name)
            if endpoint is None:
                raise PrepareError(f"DRA driver {name} is not registered")
            state.cdi[name] = await endpoint.prepare(ref)
        self.state.claims[uid] = state
        self._changed()
        return state

    async def unprepare_pod(self, pod_uid: str) -> None:
        """Release the pod's claims; a claim no other pod uses is unprepared (a
        driver's failure is logged: the kubelet goes on)."""
        for uid, state in list(self.state.claims.items()):
            if pod_uid not in state.pods:
                continue
            state.pods.remove(pod_uid)
            if not state.pods:
                await self._unprepare(state)
                del self.state.claims[uid]
            self._changed()

    async def _unprepare(self, state: PreparedClaimState) -> None:
        ref = ClaimRef(state.namespace, state.name, state.uid)
        for name in state.cdi:
            if skips(state.results, name, UNPREPARE):
                continue
            endpoint = self.endpoint_of(name)
            if endpoint is None:
                log.warning(
                    "cannot unprepare claim %s: driver %s is not registered", state.name, name
                )
                continue
            try:
                await endpoint.unprepare(ref)
            except PrepareError as error:
                log.warning("%s", error)
