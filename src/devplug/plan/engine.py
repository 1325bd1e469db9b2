"""One run of a workload against a fleet: where each pod went and what each node holds.

Two ways to decide placement, both ending at the same kubelet stand-ins (the fleet's
nodes, with their plugins and device managers):

- `run_fit`: no API server; the fit step of `devplug.plan.fit` picks each pod's node,
  in workload order, and DRA claims get the node's first free devices.
- `run_scheduler`: the fleet registered with a real API server, the pods created there
  and placed by the real kube-scheduler (claims allocated by it too); the run ends
  once every pod is running, failed or marked unschedulable, and nothing has changed
  for `settle_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from devplug.apiserver import failures
from devplug.apiserver.client import FAILURES
from devplug.config.ids import physical_id
from devplug.fleet.hardware import PoolHardware, build_pool
from devplug.fleet.node import FleetNode
from devplug.fleet.objects import node_labels, taints
from devplug.fleet.requests import pod_requests
from devplug.fleet.spec import Fleet
from devplug.framework.dra.driver import DriverBinding
from devplug.kube.dranames import device_name
from devplug.plan.fit import NodeView, pick
from devplug.plan.variants import PlannedPod, Variant, apply, mig_offers, planned_pods
from devplug.plan.workload import Workload

ENGINE_FIT = "fit step"
ENGINE_SCHEDULER = "kube-scheduler"
SETTLE_S = 2.0


@dataclass
class PodOutcome:
    name: str
    phase: str  # Running, Failed (by the kubelet) or Pending (not scheduled)
    node: str | None = None
    pool: str | None = None
    reason: str = ""
    message: str = ""


@dataclass
class Run:
    variant: Variant
    engine: str
    pods: list[PodOutcome]
    # each node at the end of the run: `requested` holds its devices in use too
    nodes: list[NodeView]
    # device resources counted per pool (device plugins; DRA drivers as 'dra:<driver>')
    devices: dict[str, list[str]]
    # after each pod: devices in use per pool, for the utilisation over the run
    timeline: list[dict[str, int]]
    planned: list[PlannedPod] = field(default_factory=list)
    # per pool and device-plugin resource: [physical devices, those a pod holds a share
    # of] (the replicas of one device, 'gpu0::1', count once)
    physical: dict[str, dict[str, list[int]]] = field(default_factory=dict)


def physical_devices(nodes: Sequence[FleetNode]) -> dict[str, dict[str, list[int]]]:
    """Per pool and resource: the physical devices behind its units, and those in use."""
    found: dict[str, dict[str, list[int]]] = {}
    for node in nodes:
        pool = found.setdefault(node.hardware.pool.name, {})
        for name, state in node.manager.resources.items():
            row = pool.setdefault(name, [0, 0])
            row[0] += len({physical_id(d) for d in state.healthy})
            row[1] += len({physical_id(d) for d in node.manager.in_use(name)})
    return found


def _build(fleet: Fleet, folder: Path) -> dict[str, PoolHardware]:
    return {pool.name: build_pool(pool, folder) for pool in fleet.pools}


def _drivers(hardware: Mapping[str, PoolHardware]) -> dict[str, str]:
    return {d.plugin.resource_name: d.name for h in hardware.values() for d in h.drivers}


def device_resources(hardware: Mapping[str, PoolHardware]) -> dict[str, list[str]]:
    return {
        pool: [p.resource_name for p in h.device_plugins if p.devices]
        + [f"dra:{d.name}" for d in h.drivers]
        for pool, h in hardware.items()
    }


def _node_labels(node: FleetNode, fleet: Fleet) -> dict[str, str]:
    return node_labels(node.name, fleet.name, node.hardware.pool, node.hardware.labels)


def _in_use(node: FleetNode, held_claims: Mapping[str, list[str]]) -> dict[str, int]:
    used = {r: node.devices_in_use(r) for r in node.manager.resources}
    for driver, names in held_claims.items():
        used[f"dra:{driver}"] = len(names)
    return used


def _healthy_names(driver: DriverBinding) -> list[str]:
    """The names a driver's healthy devices have in its slices."""
    return [device_name(d.id) for d in driver.plugin.devices.values() if d.healthy]


def _state(node: FleetNode, fleet: Fleet, held: Mapping[str, list[str]]) -> NodeView:
    allocatable = node.allocatable()
    free: dict[str, list[str]] = {}
    for driver in node.hardware.drivers:
        names = _healthy_names(driver)
        allocatable[f"dra:{driver.name}"] = len(names)
        taken = set(held.get(driver.name, []))
        free[driver.name] = [n for n in names if n not in taken]
    return NodeView(
        node.name,
        node.hardware.pool.name,
        _node_labels(node, fleet),
        taints(node.hardware.pool),
        allocatable,
        node.used() | _in_use(node, held),
        free,
    )


def _devices_used(
    node: FleetNode, held: Mapping[str, list[str]], devices: Mapping[str, list[str]]
) -> int:
    used = _in_use(node, held)
    return sum(used.get(r, 0) for r in devices.get(node.hardware.pool.name, []))


async def run_fit(fleet: Fleet, workload: Workload, variant: Variant, folder: Path) -> Run:
    fleet = apply(fleet, variant)
    hardware = _build(fleet, folder)
    devices = device_resources(hardware)
    planned = planned_pods(workload, _drivers(hardware), mig_offers(list(hardware.values())))
    nodes: list[FleetNode] = []
    for pool in fleet.pools:
        for name in pool.nodes:
            node = FleetNode(name, hardware[pool.name], folder)
            await node.start()
            nodes.append(node)
    free = {n.name: {d.name: _healthy_names(d) for d in n.hardware.drivers} for n in nodes}
    held: dict[str, dict[str, list[str]]] = {n.name: {} for n in nodes}
    claimed: dict[str, dict[str, list[str]]] = {}  # pod -> driver -> devices
    # The scheduler's view of each node; only the node a pod went to changes, so only
    # its view is brought up to date after each pod.
    views = [
        NodeView(n.name, n.hardware.pool.name, _node_labels(n, fleet), taints(n.hardware.pool),
                 n.allocatable(), n.used(), free[n.name])
        for n in nodes
    ]  # fmt: skip
    outcomes: list[PodOutcome] = []
    timeline: list[dict[str, int]] = []
    by_name = {n.name: n for n in nodes}
    point = {pool.name: 0 for pool in fleet.pools}
    for index, pod in enumerate(planned):
        manifest = pod.manifest
        manifest["metadata"]["uid"] = f"plan-{index}-{uuid.uuid4().hex[:8]}"
        manifest["metadata"]["namespace"] = "default"
        requests = pod_requests(manifest)
        chosen, message = pick(manifest["spec"], requests, pod.claims, views)
        if chosen is None:
            outcomes.append(
                PodOutcome(pod.name, "Pending", reason="Unschedulable", message=message)
            )
        else:
            node = by_name[chosen.name]
            before = _devices_used(node, held[node.name], devices)
            claims = _allocate_claims(pod, node, free[node.name])
            admission = await node.admit(manifest, claims)
            pool_name = node.hardware.pool.name
            if admission.admitted:
                taken = {d: [r["device"] for r in _results(claims, d)] for d in pod.claims}
                claimed[pod.name] = taken
                for driver, names in taken.items():
                    held[node.name].setdefault(driver, []).extend(names)
                outcomes.append(PodOutcome(pod.name, "Running", node.name, pool_name))
            else:
                for driver in pod.claims:  # give the devices back
                    free[node.name][driver].extend(r["device"] for r in _results(claims, driver))
                reason, text = admission.event or ("", "")
                phase = "Failed" if admission.status else "Pending"
                outcomes.append(PodOutcome(pod.name, phase, node.name, pool_name, reason, text))
            point[pool_name] += _devices_used(node, held[node.name], devices) - before
            chosen.requested = node.used()
        timeline.append(dict(point))
    states = [_state(n, fleet, held[n.name]) for n in nodes]
    physical = physical_devices(nodes)
    for node in nodes:
        await node.stop()
    return Run(variant, ENGINE_FIT, outcomes, states, devices, timeline, planned, physical)


def _results(claims: Mapping[str, Any], driver: str) -> list[dict[str, Any]]:
    return [
        r
        for claim in claims.values()
        for r in claim["status"]["allocation"]["devices"]["results"]
        if r["driver"] == driver
    ]


def _allocate_claims(
    pod: PlannedPod, node: FleetNode, free: dict[str, list[str]]
) -> dict[str, Any]:
    """The claims of the pod, allocated on `node` from its first free devices (the fit
    step made sure there are enough)."""
    claims: dict[str, Any] = {}
    for claim in pod.claim_requests:
        driver, count = claim["driver"], claim["count"]
        taken, free[driver] = free[driver][:count], free[driver][count:]
        name = f"{pod.name}-{claim['name']}"
        claims[name] = {
            "metadata": {"name": name, "uid": str(uuid.uuid4())},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "devices",
                                "driver": driver,
                                "pool": node.name,
                                "device": device,
                            }
                            for device in taken
                        ]
                    }
                }
            },
        }
    return claims


# -- the real scheduler ----------------------------------------------------------------------


async def run_scheduler(
    fleet: Fleet,
    workload: Workload,
    variant: Variant,
    folder: Path,
    api: Any,
    *,
    settle_s: float = SETTLE_S,
    timeout_s: float = 600.0,
) -> Run:
    from devplug.fleet.runner import FleetRunner, remove_fleet

    fleet = apply(fleet, variant)
    runner = FleetRunner(fleet, api, folder)
    stop = asyncio.Event()
    namespace = f"plan-{uuid.uuid4().hex[:8]}"
    classes: list[str] = []
    serving: asyncio.Task[None] | None = None
    timeline: list[dict[str, int]] = []
    reachable = True
    try:
        await runner.start()
        hardware = runner.hardware
        devices = device_resources(hardware)
        planned = planned_pods(workload, _drivers(hardware), mig_offers(list(hardware.values())))

        point = {pool.name: 0 for pool in fleet.pools}
        counted: dict[str, int] = {}

        def after_pod(pod: Mapping[str, Any], name: str, admitted: bool) -> None:
            node = runner.nodes[name]
            now = _devices_used(node, _held_claims(node), devices)
            point[node.hardware.pool.name] += now - counted.get(name, 0)
            counted[name] = now
            timeline.append(dict(point))

        runner.on_pod = after_pod
        serving = asyncio.create_task(runner.serve(stop))
        await api.call("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        for driver in sorted({d for p in planned for d in p.claims}):
            name = f"{namespace}-{driver}"
            selector = {"cel": {"expression": f'device.driver == "{driver}"'}}
            await api.call(
                "POST",
                "/apis/resource.k8s.io/v1/deviceclasses",
                {"metadata": {"name": name}, "spec": {"selectors": [selector]}},
            )
            classes.append(name)
        await _create(api, namespace, planned)
        pods = await _settle(api, namespace, {p.name for p in planned}, settle_s, timeout_s)
        outcomes = [_outcome(pods.get(p.name, {}), runner) for p in planned]
        states = [_state(n, fleet, _held_claims(n)) for n in runner.nodes.values()]
        physical = physical_devices(list(runner.nodes.values()))
        return Run(
            variant, ENGINE_SCHEDULER, outcomes, states, devices, timeline, planned, physical
        )
    except FAILURES as error:
        # Away for longer than the command waits, or refusing for good: tidying up
        # would wait as long again and fail the same way.
        reachable = failures.kind(error) == failures.ANSWER
        raise
    finally:
        stop.set()
        if serving is not None:
            await serving
        if reachable:
            with contextlib.suppress(Exception):
                await _clean(api, namespace, classes)
            await remove_fleet(api, fleet.name)


def _held_claims(node: FleetNode) -> dict[str, list[str]]:
    return node.prepared_devices()


async def _create(api: Any, namespace: str, planned: Sequence[PlannedPod]) -> None:
    """Each pod after its claims, one at a time in order: the scheduler's queue sees
    them as the workload lists them."""
    for pod in planned:
        for claim in pod.claim_requests:
            request = {
                "name": "devices",
                "exactly": {
                    "deviceClassName": f"{namespace}-{claim['driver']}",
                    "count": claim["count"],
                },
            }
            body = {
                "metadata": {"name": f"{pod.name}-{claim['name']}"},
                "spec": {"devices": {"requests": [request]}},
            }
            await api.call(
                "POST", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims", body
            )
        await api.call("POST", f"/api/v1/namespaces/{namespace}/pods", pod.manifest)


def _decided(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") in ("Running", "Failed"):
        return True
    return any(
        c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or []
    )


async def _settle(
    api: Any, namespace: str, names: set[str], settle_s: float, timeout_s: float
) -> dict[str, dict[str, Any]]:
    """Watch the run's pods until each is decided and nothing changed for `settle_s`."""
    path = f"/api/v1/namespaces/{namespace}/pods"
    listed = await api.call("GET", path)
    pods = {p["metadata"]["name"]: p for p in listed["items"]}
    version = listed["metadata"]["resourceVersion"]
    deadline = time.monotonic() + timeout_s
    changed = asyncio.Event()

    async def follow() -> None:
        nonlocal version
        try:
            while True:
                async for line in api.watch(path, {"resourceVersion": version}, 300):
                    event = msgspec.json.decode(line)
                    obj = event["object"]
                    version = obj["metadata"].get("resourceVersion", version)
                    if event["type"] in ("ADDED", "MODIFIED"):
                        pods[obj["metadata"]["name"]] = obj
                        changed.set()
        finally:
            changed.set()  # a watch that failed wakes the loop, which raises its error

    watcher = asyncio.create_task(follow())
    try:
        while time.monotonic() < deadline:
            if watcher.done():
                watcher.result()
            if names <= set(pods) and all(_decided(pods[n]) for n in names):
                changed.clear()
                try:
                    await asyncio.wait_for(changed.wait(), settle_s)
                except TimeoutError:
                    return pods
                continue
            changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), max(0.1, deadline - time.monotonic()))
        return pods
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


def _outcome(pod: Mapping[str, Any], runner: Any) -> PodOutcome:
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    name = str(meta.get("name", ""))
    node = spec.get("nodeName")
    pool = runner.pool_of[node].name if node in runner.pool_of else None
    phase = status.get("phase", "Pending")
    if phase == "Running":
        return PodOutcome(name, "Running", node, pool)
    if phase == "Failed":
        return PodOutcome(
            name, "Failed", node, pool, status.get("reason", ""), status.get("message", "")
        )
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return PodOutcome(
                name,
                "Pending",
                None,
                None,
                condition.get("reason", ""),
                condition.get("message", ""),
            )
    return PodOutcome(name, "Pending", node, pool)


async def _clean(api: Any, namespace: str, classes: Sequence[str]) -> None:
    """Remove the run's pods, claims and classes (each pod at once: no kubelet waits)."""
    body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}
    for path in (
        f"/api/v1/namespaces/{namespace}/pods",
        f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims",
    ):
        listed = await api.call("GET", path)
        for item in listed.get("items") or []:
            with contextlib.suppress(Exception):
                await api.call("DELETE", f"{path}/{item['metadata']['name']}", body)
    for name in classes:
        with contextlib.suppress(Exception):
            await api.call("DELETE", f"/apis/resource.k8s.io/v1/deviceclasses/{name}")
    with contextlib.suppress(Exception):
        await api.call("DELETE", f"/api/v1/namespaces/{namespace}")
