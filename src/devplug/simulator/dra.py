"""The kubelet's DRA path: the plugin watcher that registers DRA drivers from
plugins_registry, and the claims of pods prepared through NodePrepareResources.

    dra = DraManager(registry_dir, state_dir, claims=FileClaims(folder))
    await dra.start()                       # registers the drivers found, and new ones
    cdi = await dra.prepare_pod(pod)        # {container: [CDI device IDs]}
    await dra.unprepare_pod(pod)

The claims a pod references (`spec.resourceClaims`) are read from a claim source
(the API server, or claim documents in a folder); their allocation names the
drivers, each asked to prepare the claims it has devices in. What was prepared is
kept in `<state-dir>/dra_manager_state`, so a restarted kubelet still knows the CDI
devices of running pods, and asks the drivers again only for what it does not know.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import msgspec

from devplug.framework.dra.claims import ClaimError, ClaimSource, FileClaims
from devplug.framework.dra.driver import ClaimRef
from devplug.simulator.draplugins import (
    _VERSIONS,
    CALL_TIMEOUT_S,
    DEVICE_HEALTH,
    DRIVER_REFUSED,
    DRIVER_REGISTERED,
    DRIVER_REMOVED,
    SLICES_WIPED,
    WIPING_DELAY_S,
    DraPlugins,
    NodeSlices,
    RegisteredDriver,
)
from devplug.simulator.pods import PodSpec, dra_backed_resources
from devplug.simulator.results import REASON_FAILED_PREPARE, REASON_UNSCHEDULABLE, DraClaimStatus

__all__ = [
    "CALL_TIMEOUT_S",
    "DEVICE_HEALTH",
    "DRIVER_REFUSED",
    "DRIVER_REGISTERED",
    "DRIVER_REMOVED",
    "EXTENDED_CLAIM",
    "SLICES_WIPED",
    "STATE_FILE",
    "WIPING_DELAY_S",
    "DraManager",
    "DraPlugins",
    "NodeSlices",
    "PrepareError",
    "PreparedClaimState",
    "RegisteredDriver",
    "State",
    "container_claims",
    "pod_claims",
    "skips",
]

log = logging.getLogger("devplug.simulator.dra")

STATE_FILE = "dra_manager_state"


def skips(results: Sequence[Mapping[str, Any]], driver: str, operation: str) -> bool:
    """Whether every allocated device of `driver` skips `operation` (its slice's
    `skipNodeOperations`, copied into the allocation: Kubernetes 1.37, alpha), so that
    the kubelet makes no call to the driver for it."""
    mine = [r for r in results if r.get("driver") == driver]
    return bool(mine) and all(
        {operation, "*"} & set(r.get("skipNodeOperations") or ()) for r in mine
    )


class PrepareError(Exception):
    """A claim of the pod could not be prepared (the kubelet's FailedPrepareDynamicResources),
    or (`reason` Unschedulable) could never have been allocated so."""

    def __init__(self, message: str, reason: str = REASON_FAILED_PREPARE) -> None:
        super().__init__(message)
        self.reason = reason


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


# The pod claim name under which the claim the scheduler made for a pod's extended
# resources is known here (no real pod claim can have it: not a DNS label).
EXTENDED_CLAIM = "<extended-resources>"


def pod_claims(pod: PodSpec) -> dict[str, str]:
    """Pod claim name -> ResourceClaim name, from spec.resourceClaims (direct names,
    or generated ones from status.resourceClaimStatuses), and the claim of the pod's
    extended resources served through DRA (status.extendedResourceClaimStatus)."""
    spec = pod.manifest.get("spec") or {}
    status = pod.manifest.get("status") or {}
    extended = status.get("extendedResourceClaimStatus")
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


class DraManager:
    """The kubelet's DRA manager: the claims of pods, prepared by the drivers its
    plugin watcher (DraPlugins) registered."""

    def __init__(
        self,
        registry_dir: Path | str,
        state_dir: Path | str,
        claims: ClaimSource,
        *,
        on_event: Callable[[str, str, str], None] | None = None,
        slices: NodeSlices | None = None,
    ) -> None:
        self.registry_dir = Path(registry_dir)
        self.state_path = Path(state_dir) / STATE_FILE
        self.claims = claims
        self.plugins = DraPlugins(self.registry_dir, on_event=on_event, slices=slices)
        self.drivers = self.plugins.drivers
        self.slices = slices
        self.device_health = self.plugins.device_health
        self.device_health_message = self.plugins.device_health_message
        self._state = self._load()
        # Claims from a folder were allocated by no scheduler: check them as it would,
        # against the slices the drivers write there.
        self._slices_dir = claims.folder if isinstance(claims, FileClaims) else None

    async def start(self) -> None:
        """Register the drivers whose sockets are in the registry folder, and watch it
        for more (as the kubelet's plugin watcher does after a start)."""
        await self.plugins.start()

    async def stop(self) -> None:
        await self.plugins.stop()

    # -- state ----------------------------------------------------------------------

    def _load(self) -> State:
        try:
            return msgspec.json.decode(self.state_path.read_bytes(), type=State)
        except FileNotFoundError:
            return State()
        except msgspec.DecodeError as error:
            log.error(
                "cannot read %s: %s; starting without prepared claims", self.state_path, error
            )
            return State()

    def _save(self) -> None:
        from devplug.ground.files import write_atomic

        write_atomic(self.state_path, msgspec.json.encode(self._state), mode=0o600)

    # -- claims ------------------------------------------------------------------------

    async def prepare_pod(self, pod: PodSpec) -> dict[str, list[str]]:
        """Prepare the pod's claims; the CDI device IDs of each container."""
        claims: dict[str, PreparedClaimState] = {}
        for pod_claim, claim_name in pod_claims(pod).items():
            claims[pod_claim] = await self._prepare_claim(pod, claim_name)
        return self._container_cdi(pod, claims)

    def container_cdi(self, pod: PodSpec) -> dict[str, list[str]]:
        """The CDI device IDs of each container of a pod whose claims are prepared."""
        by_name = {(c.namespace, c.name): c for c in self._state.claims.values()}
        claims = {
            pod_claim: by_name[(pod.namespace, claim_name)]
            for pod_claim, claim_name in pod_claims(pod).items()
            if (pod.namespace, claim_name) in by_name
        }
        return self._container_cdi(pod, claims)

    @staticmethod
    def _container_cdi(
        pod: PodSpec, claims: Mapping[str, PreparedClaimState]
    ) -> dict[str, list[str]]:
        result: dict[str, list[str]] = {}
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

    async def _prepare_claim(self, pod: PodSpec, claim_name: str) -> PreparedClaimState:
        try:
            obj = await asyncio.to_thread(self.claims.get, ClaimRef(pod.namespace, claim_name, ""))
        except ClaimError as error:
            raise PrepareError(str(error)) from None
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        known = self._state.claims.get(uid)
        if known is not None:
            if pod.uid not in known.pods:
                known.pods.append(pod.uid)
                self._save()
            return known
        allocation = (obj.get("status") or {}).get("allocation")
        if not allocation:
            raise PrepareError(f"ResourceClaim {pod.namespace}/{claim_name} is not allocated")
        results = (allocation.get("devices") or {}).get("results") or []
        if self._slices_dir is not None:
            self._check_allocation(f"{pod.namespace}/{claim_name}", results)
        drivers = sorted({str(r.get("driver")) for r in results})
        state = PreparedClaimState(
            pod.namespace, claim_name, uid, pods=[pod.uid], results=list(results)
        )
        for name in drivers:
            if skips(results, name, "NodePrepareResources"):
                continue  # as a 1.37 kubelet with DRAOptionalNodeOperations: not even looked up
            driver = self.drivers.get(name)
            if driver is None:
                raise PrepareError(f"DRA driver {name} is not registered")
            pb = _VERSIONS[driver.version][0]
            claim = pb.Claim(namespace=pod.namespace, uid=uid, name=claim_name)
            try:
                response = await driver.stub.NodePrepareResources(
                    pb.NodePrepareResourcesRequest(claims=[claim]), timeout=CALL_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as error:
                raise PrepareError(
                    f"NodePrepareResources of {name} failed: {error.code().name}: {error.details()}"
                ) from None
            if uid not in response.claims:
                raise PrepareError(f"{name} did not answer for claim {claim_name}")
            answer = response.claims[uid]
            if answer.error:
                raise PrepareError(f"{name}: claim {pod.namespace}/{claim_name}: {answer.error}")
            by_request: dict[str, list[str]] = {}
            for device in answer.devices:
                for request in device.request_names or [""]:
                    by_request.setdefault(request, []).extend(device.cdi_device_ids)
            state.cdi[name] = by_request
        self._state.claims[uid] = state
        self._save()
        return state

    def _check_allocation(self, claim: str, results: list[dict[str, Any]]) -> None:
        from devplug.simulator.allocation import InvalidAllocation, check, read_pools

        assert self._slices_dir is not None
        others = [(f"{c.namespace}/{c.name}", c.results) for c in self._state.claims.values()]
        try:
            check(claim, results, others, read_pools(self._slices_dir))
        except (InvalidAllocation, ValueError) as error:
            raise PrepareError(str(error), REASON_UNSCHEDULABLE) from None

    async def unprepare_pod(self, pod: PodSpec) -> None:
        """Release the pod's claims; a claim no other pod uses is unprepared."""
        for uid, state in list(self._state.claims.items()):
            if pod.uid not in state.pods:
                continue
            state.pods.remove(pod.uid)
            if not state.pods:
                await self._unprepare(state)
                del self._state.claims[uid]
            self._save()

    async def _unprepare(self, state: PreparedClaimState) -> None:
        for name in state.cdi:
            if skips(state.results, name, "NodeUnprepareResources"):
                continue
            driver = self.drivers.get(name)
            if driver is None:
                log.warning(
                    "cannot unprepare claim %s: driver %s is not registered", state.name, name
                )
                continue
            pb = _VERSIONS[driver.version][0]
            claim = pb.Claim(namespace=state.namespace, uid=state.uid, name=state.name)
            try:
                response = await driver.stub.NodeUnprepareResources(
                    pb.NodeUnprepareResourcesRequest(claims=[claim]), timeout=CALL_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as error:
                log.warning("NodeUnprepareResources of %s failed: %s", name, error.details())
                continue
            answer = response.claims.get(state.uid)
            if answer is not None and answer.error:
                log.warning("%s: unprepare of %s: %s", name, state.name, answer.error)

    def driver_versions(self) -> dict[str, str]:
        """The registered drivers and the DRA service version each is called with."""
        return {d.name: d.version for d in self.drivers.values()}

    def claim_status(self) -> list[DraClaimStatus]:
        """The prepared claims as the node status shows them: CDI devices per driver."""
        return [
            DraClaimStatus(
                c.namespace,
                c.name,
                c.uid,
                {d: sorted({i for ids in r.values() for i in ids}) for d, r in c.cdi.items()},
                list(c.pods),
            )
            for c in self._state.claims.values()
        ]
