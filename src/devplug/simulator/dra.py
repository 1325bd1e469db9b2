"""The kubelet's DRA path: the plugin watcher that registers DRA drivers from
plugins_registry, and the claims of pods prepared through NodePrepareResources
(`PodClaims`, which the fleet shares, calling each driver over gRPC).

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

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from devplug.framework.dra.claims import ClaimSource, FileClaims
from devplug.framework.dra.driver import ClaimRef
from devplug.simulator.draendpoint import GrpcDraEndpoint, PrepareError
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
from devplug.simulator.podclaims import (
    EXTENDED_CLAIM,
    PodClaims,
    PreparedClaimState,
    State,
    container_claims,
    pod_claims,
    skips,
)
from devplug.simulator.pods import PodSpec
from devplug.simulator.results import REASON_UNSCHEDULABLE, DraClaimStatus

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


class DraManager:
    """The kubelet's DRA manager: the claims of pods (PodClaims), prepared by the
    drivers its plugin watcher (DraPlugins) registered, called over gRPC."""

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
        self.pod_claims = PodClaims(
            self._read_claim,
            self._endpoint_of,
            state=self._state,
            on_change=self._save,
            check=self._check_allocation if self._slices_dir is not None else None,
        )

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

    async def _read_claim(self, claim: ClaimRef) -> Mapping[str, Any]:
        return await self.claims.get(claim)

    def _endpoint_of(self, name: str) -> GrpcDraEndpoint | None:
        driver = self.drivers.get(name)
        if driver is None:
            return None
        return GrpcDraEndpoint(name, _VERSIONS[driver.version][0], driver.stub)

    def _check_allocation(self, claim: str, results: list[dict[str, Any]], state: State) -> None:
        from devplug.simulator.allocation import InvalidAllocation, check, read_pools

        assert self._slices_dir is not None
        others = [(f"{c.namespace}/{c.name}", c.results) for c in state.claims.values()]
        try:
            check(claim, results, others, read_pools(self._slices_dir))
        except (InvalidAllocation, ValueError) as error:
            raise PrepareError(str(error), REASON_UNSCHEDULABLE) from None

    async def prepare_pod(self, pod: PodSpec) -> dict[str, list[str]]:
        """Prepare the pod's claims; the CDI device IDs of each container."""
        return await self.pod_claims.prepare_pod(pod)

    def container_cdi(self, pod: PodSpec) -> dict[str, list[str]]:
        """The CDI device IDs of each container of a pod whose claims are prepared."""
        return self.pod_claims.container_cdi(pod)

    async def unprepare_pod(self, pod: PodSpec) -> None:
        """Release the pod's claims; a claim no other pod uses is unprepared."""
        await self.pod_claims.unprepare_pod(pod.uid)

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
