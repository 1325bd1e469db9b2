"""One simulated node: the kubelet's admission of the pods bound to it, in memory.

A pod goes through what a kubelet does with it, in the kubelet's order: the resource
check of its admission handler (`OutOfcpu`, `OutOfmemory`, `OutOfpods`,
`OutOf<resource>`, with the kubelet's message), the topology manager and the device
manager of the simulator (`TopologyAffinityError`, `UnexpectedAdmissionError`),
backed by the pool's real plugins in-process; then its DRA claims are prepared by the
pool's drivers, and PreStartContainer is called where a plugin asks for it. What the
node holds is kept in its device manager, so an API server that goes away loses
nothing: the pods keep their devices and their status is written once it is back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devplug.fleet.hardware import PoolHardware
from devplug.fleet.local import LocalEndpoint
from devplug.fleet.objects import rejected_status, running_status
from devplug.fleet.requests import pod_requests, quantity_units
from devplug.framework.dra.claims import ClaimError
from devplug.framework.dra.driver import ClaimRef
from devplug.framework.dra.prepare import Preparer
from devplug.simulator.dra import pod_claims
from devplug.simulator.manager import AdmissionError, DeviceManager
from devplug.simulator.pods import InvalidPod, PodSpec, parse_pod
from devplug.simulator.results import CREATE_CONTAINER_CONFIG_ERROR, REASON_FAILED_PREPARE

log = logging.getLogger("devplug.fleet.node")

# The kubelet's reasons for a pod its resource check refuses (lifecycle/predicate.go).
OUT_OF = {"cpu": "OutOfcpu", "memory": "OutOfmemory", "pods": "OutOfpods"}
# Resources a stopped plugin keeps for this long, as in the kubelet (no plugin stops
# in a fleet unless the process does).
GRACE_PERIOD_S = 300.0


@dataclass(slots=True)
class Held:
    """A pod the node runs: what it counts against the node."""

    name: str
    namespace: str
    requests: dict[str, int]
    claims: list[ClaimRef] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Admission:
    """What became of a pod: its status for the API server, and the Warning Event
    (reason, message) a kubelet records for it, if any."""

    admitted: bool
    status: dict[str, Any]
    event: tuple[str, str] | None = None
    devices: dict[str, dict[str, list[str]]] = field(default_factory=dict)


class _GivenClaims:
    """The claims of the pod being prepared, read from the API server beforehand."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], Mapping[str, Any]] = {}

    def get(self, claim: ClaimRef) -> Mapping[str, Any]:
        found = self.objects.get((claim.namespace, claim.name))
        if found is None:
            raise ClaimError(f"ResourceClaim {claim.namespace}/{claim.name} not found")
        return found


class FleetNode:
    def __init__(
        self,
        name: str,
        hardware: PoolHardware,
        folder: Path,
        *,
        topology_policy: str | None = None,
    ) -> None:
        spec = hardware.pool.spec
        self.name = name
        self.hardware = hardware
        self.folder = folder
        numa = spec.numa_nodes
        self.manager = DeviceManager(
            None,
            policy=topology_policy or spec.topology_policy,
            numa_nodes=list(range(numa)) if numa is not None else None,
            grace_period=GRACE_PERIOD_S,
            dial_timeout=1.0,
            on_event=self._on_event,
        )
        self.capacity = {
            "cpu": quantity_units("cpu", spec.cpu),
            "memory": quantity_units("memory", spec.memory),
            "pods": spec.pods,
        }
        self.held: dict[str, Held] = {}
        self._claims = _GivenClaims()
        self._preparers: dict[str, Preparer] = {}
        self._listed = 0
        self._all_listed = asyncio.Event()

    def _on_event(self, kind: str, resource: str, detail: str) -> None:
        if kind == "devices":
            self._listed += 1
            if self._listed >= len(self.hardware.device_plugins):
                self._all_listed.set()

    async def start(self) -> None:
        """Attach the pool's plugins and wait until each has listed its devices."""
        for plugin in self.hardware.device_plugins:
            await self.manager.attach(plugin.resource_name, LocalEndpoint(plugin))
        if self.hardware.device_plugins:
            await self._all_listed.wait()

    async def stop(self) -> None:
        await self.manager.close()

    # -- what the node has -----------------------------------------------------------

    def allocatable(self) -> dict[str, int]:
        """Native and device-plugin allocatable, as the node reports them."""
        devices = {name: len(state.healthy) for name, state in self.manager.resources.items()}
        return self.capacity | devices

    def used(self) -> dict[str, int]:
        """What the node's pods request (pods counted), the kubelet's view."""
        total: dict[str, int] = {"pods": len(self.held)}
        for pod in self.held.values():
            for name, value in pod.requests.items():
                total[name] = total.get(name, 0) + value
        return total

    def devices_in_use(self, resource: str) -> int:
        return len(self.manager.in_use(resource))

    # -- admission ---------------------------------------------------------------------

    async def admit(self, pod: Mapping[str, Any], claims: Mapping[str, Any]) -> Admission:
        """Admit one pod bound to this node (its API object) with its claims' objects."""
        meta, spec_doc = pod["metadata"], pod.get("spec") or {}
        parsed = parse_pod(pod)
        if isinstance(parsed, InvalidPod):  # the API server took it, so only a bug does this
            return self._refuse(parsed, "UnexpectedAdmissionError", parsed.message)
        requests = pod_requests(pod, parsed)
        if refusal := self._resource_check(requests):
            return self._refuse(parsed, *refusal)
        placements = self.hardware.placements
        if placements is None:
            rejection = await self.manager.admit(parsed)
        else:
            with placements.admitting(self.name, pod):
                rejection = await self.manager.admit(parsed)
        if rejection is not None:
            return self._refuse(parsed, rejection.reason, rejection.message)
        held = Held(meta["name"], meta.get("namespace") or "default", requests)
        self.held[parsed.uid] = held
        try:
            held.claims = await self._prepare(parsed, claims)
        except ClaimError as error:
            # The kubelet retries a failed preparation and the pod waits meanwhile.
            self.manager.remove_pod(parsed.uid)
            del self.held[parsed.uid]
            message = f"failed to prepare dynamic resources: {error}"
            return Admission(False, {}, (REASON_FAILED_PREPARE, message))
        waiting: dict[str, tuple[str, str]] = {}
        for container in parsed.all_containers:
            try:
                await self.manager.pre_start(parsed, container)
            except AdmissionError as error:
                waiting[container.name] = (CREATE_CONTAINER_CONFIG_ERROR, str(error))
        devices = {
            c.name: {
                resource: allocation.ids()
                for resource, allocation in self.manager.container_devices(
                    parsed.uid, c.name
                ).items()
            }
            for c in parsed.all_containers
        }
        status = running_status(
            spec_doc.get("containers") or [], spec_doc.get("initContainers") or [], waiting
        )
        return Admission(True, status, devices=devices)

    def _refuse(self, pod: PodSpec | InvalidPod, reason: str, message: str) -> Admission:
        log.info(
            "%s: pod %s/%s rejected: %s: %s", self.name, pod.namespace, pod.name, reason, message
        )
        return Admission(False, rejected_status(reason, message), (reason, message))

    def _resource_check(self, requests: Mapping[str, int]) -> tuple[str, str] | None:
        """The kubelet's resource check (its first failure); extended resources the
        node does not have are left out, as the kubelet leaves them out."""
        allocatable = self.allocatable()
        used = self.used()
        wanted = {"pods": 1, **requests}
        for name, amount in wanted.items():
            if name not in allocatable or amount == 0:
                continue
            if used.get(name, 0) + amount > allocatable[name]:
                return (
                    OUT_OF.get(name, f"OutOf{name}"),
                    f"Node didn't have enough resource: {name}, requested: {amount}, "
                    f"used: {used.get(name, 0)}, capacity: {allocatable[name]}",
                )
        return None

    async def _prepare(self, pod: PodSpec, claims: Mapping[str, Any]) -> list[ClaimRef]:
        """NodePrepareResources for each claim of the pod with devices of our drivers."""
        prepared: list[ClaimRef] = []
        for claim_name in pod_claims(pod).values():
            obj = claims.get(claim_name)
            if obj is None:
                raise ClaimError(f"ResourceClaim {pod.namespace}/{claim_name} not found")
            meta = obj.get("metadata") or {}
            ref = ClaimRef(pod.namespace, claim_name, str(meta.get("uid")))
            self._claims.objects[(ref.namespace, ref.name)] = obj
            try:
                for driver in self._drivers_of(obj):
                    await self._preparer(driver).prepare(ref)
            finally:
                self._claims.objects.pop((ref.namespace, ref.name), None)
            prepared.append(ref)
        return prepared

    def _drivers_of(self, claim: Mapping[str, Any]) -> list[str]:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        results = (allocation.get("devices") or {}).get("results") or []
        ours = {d.name for d in self.hardware.drivers}
        named = {r.get("driver") for r in results if r.get("pool") == self.name}
        if not results:
            raise ClaimError("the claim is not allocated")
        return sorted(n for n in named if n in ours)

    def _preparer(self, driver_name: str) -> Preparer:
        found = self._preparers.get(driver_name)
        if found is None:
            driver = next(d for d in self.hardware.drivers if d.name == driver_name)
            folder = self.folder / self.name / driver_name
            found = Preparer(driver, self.name, self._claims, folder / "cdi", folder)
            self._preparers[driver_name] = found
        return found

    async def release(self, uid: str) -> bool:
        """The pod is gone: free its devices and unprepare its claims."""
        held = self.held.pop(uid, None)
        if held is None:
            return False
        self.manager.remove_pod(uid)
        for ref in held.claims:
            for preparer in self._preparers.values():
                try:
                    await preparer.unprepare(ref)
                except ClaimError as error:
                    log.warning(
                        "%s: unpreparing %s/%s: %s", self.name, ref.namespace, ref.name, error
                    )
        return True
