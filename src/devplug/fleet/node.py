"""One simulated node: the kubelet's admission of the pods bound to it, in memory.

A pod goes through the kubelet's admission of the simulator (`pipeline.admit_pod`), in
the kubelet's order: the resource check of its admission handler (`OutOfcpu`,
`OutOfmemory`, `OutOfpods`, `OutOf<resource>`, with the kubelet's message), the
topology manager and the device manager (`TopologyAffinityError`,
`UnexpectedAdmissionError`), backed by the pool's real plugins in-process
(`LocalEndpoint`); then its DRA claims are prepared by the pool's drivers in-process
(`LocalDraEndpoint`), and PreStartContainer is called where a plugin asks for it. What the
node holds is kept in its device manager, so an API server that goes away loses
nothing: the pods keep their devices and their status is written once it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devplug.fleet.hardware import PoolHardware
from devplug.fleet.local import LocalDraEndpoint, LocalEndpoint
from devplug.fleet.objects import rejected_status, running_status
from devplug.fleet.requests import pod_requests, quantity_units
from devplug.framework.dra.claims import ClaimError
from devplug.framework.dra.driver import ClaimRef
from devplug.framework.dra.prepare import Preparer
from devplug.simulator.manager import DeviceManager
from devplug.simulator.pipeline import DRA, Refusal, admit_pod
from devplug.simulator.podclaims import PodClaims, pod_claims
from devplug.simulator.pods import InvalidPod, PodSpec, parse_pod
from devplug.simulator.results import STARTED, WAITING

log = logging.getLogger("devplug.fleet.node")

# The kubelet's reasons for a pod its resource check refuses (lifecycle/predicate.go).
OUT_OF = {"cpu": "OutOfcpu", "memory": "OutOfmemory", "pods": "OutOfpods"}
# The waiting reason of a container while an init container before it has not run.
POD_INITIALIZING = "PodInitializing"
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

    async def get(self, claim: ClaimRef) -> Mapping[str, Any]:
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
        self._endpoints: dict[str, LocalDraEndpoint] = {}
        self.claims = PodClaims(self._read_claim, self._endpoint_of)
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

    @property
    def preparers(self) -> dict[str, Preparer]:
        """The preparer of each driver called so far, by driver name."""
        return {name: endpoint.preparer for name, endpoint in self._endpoints.items()}

    def prepared_devices(self) -> dict[str, list[str]]:
        """The devices of each driver that prepared claims hold."""
        held: dict[str, list[str]] = {}
        for driver, preparer in self.preparers.items():
            for claim in preparer.prepared.values():
                held.setdefault(driver, []).extend(d.device for d in claim.devices)
        return held

    # -- admission ---------------------------------------------------------------------

    async def admit(self, pod: Mapping[str, Any], claims: Mapping[str, Any]) -> Admission:
        """Admit one pod bound to this node (its API object) with its claims' objects."""
        meta, spec_doc = pod["metadata"], pod.get("spec") or {}
        parsed = parse_pod(pod)
        if isinstance(parsed, InvalidPod):  # the API server took it, so only a bug does this
            return self._refuse(parsed, "UnexpectedAdmissionError", parsed.message)
        requests = pod_requests(pod, parsed)
        given = self._claims.objects
        given.update(((parsed.namespace, name), obj) for name, obj in claims.items())
        placements = self.hardware.placements
        # A GPU share for the extender: the plugin is told the pod it answers for.
        chosen = (
            placements.admitting(self.name, pod)
            if placements is not None
            else contextlib.nullcontext()
        )
        try:
            with chosen:
                admitted = await admit_pod(
                    parsed,
                    self.manager,
                    self.claims,
                    resource_check=lambda _: self._resource_check(requests),
                    runtime_options=False,  # no container runtime here
                )
        finally:
            given.clear()
        if isinstance(admitted, Refusal):
            if admitted.step == DRA:  # the kubelet retries; the pod waits meanwhile
                message = f"failed to prepare dynamic resources: {admitted.message}"
                return Admission(False, {}, (admitted.reason, message))
            return self._refuse(parsed, admitted.reason, admitted.message)
        refs = [
            ClaimRef(parsed.namespace, name, str((claims[name].get("metadata") or {}).get("uid")))
            for name in (pod_claims(parsed).values() if claims else ())
            if name in claims
        ]
        self.held[parsed.uid] = Held(
            meta["name"], meta.get("namespace") or "default", requests, refs
        )
        waiting = {
            c.name: (c.state, c.message) if c.state != WAITING else (POD_INITIALIZING, "")
            for c in admitted
            if c.state != STARTED
        }
        status = running_status(
            spec_doc.get("containers") or [], spec_doc.get("initContainers") or [], waiting
        )
        return Admission(True, status, devices={c.name: c.devices for c in admitted})

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

    async def _read_claim(self, claim: ClaimRef) -> Mapping[str, Any]:
        return await self._claims.get(claim)

    def _endpoint_of(self, driver_name: str) -> LocalDraEndpoint | None:
        """The driver of the pool on this node, made when first called."""
        found = self._endpoints.get(driver_name)
        if found is None:
            driver = next((d for d in self.hardware.drivers if d.name == driver_name), None)
            if driver is None:
                return None
            folder = self.folder / self.name / driver_name
            preparer = Preparer(driver, self.name, self._claims, folder / "cdi", folder)
            found = self._endpoints[driver_name] = LocalDraEndpoint(preparer)
        return found

    async def release(self, uid: str) -> bool:
        """The pod is gone: free its devices and unprepare its claims."""
        held = self.held.pop(uid, None)
        if held is None:
            return False
        self.manager.remove_pod(uid)
        await self.claims.unprepare_pod(uid)
        return True
