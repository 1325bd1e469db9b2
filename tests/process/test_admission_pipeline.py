"""The kubelet's admission sequence, written once for the simulated kubelet and the
fleet (`devplug.simulator.pipeline`): its steps in the kubelet's order, and a step
that refuses the pod undoing what the steps before it did. A real plugin and a real
DRA driver answer in the process (the fleet's side of both seams); the driver's
Preparer writes its CDI specs and checkpoint to real files."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devplug.fleet.local import LocalDraEndpoint, LocalEndpoint
from devplug.framework.device import ContainerEdits, Device
from devplug.framework.dra.claims import ClaimError
from devplug.framework.dra.driver import ClaimRef, DraDriver, DriverBinding
from devplug.framework.dra.prepare import Preparer
from devplug.framework.plugin import AllocationError, Plugin
from devplug.simulator.manager import DeviceManager
from devplug.simulator.pipeline import DEVICES, DRA, RESOURCES, Refusal, admit_pod
from devplug.simulator.podclaims import PodClaims
from devplug.simulator.pods import PodSpec, parse_pod
from devplug.simulator.results import (
    CREATE_CONTAINER_CONFIG_ERROR,
    REASON_FAILED_PREPARE,
    STARTED,
    ContainerResult,
)

RESOURCE = "example.com/acc"
DRIVER = "acc.example.com"
NODE = "node-a"


class Acc(Plugin):
    """Two devices; each call noted in `steps`."""

    def __init__(self, steps: list[str], refuse_pre_start: bool) -> None:
        super().__init__(RESOURCE, [Device("acc-0"), Device("acc-1")])
        self.steps = steps
        self.refuse_pre_start = refuse_pre_start

    async def allocate(self, devices: Sequence[Device]) -> ContainerEdits:
        self.steps.append("allocate " + ",".join(d.id for d in devices))
        return await super().allocate(devices)

    async def pre_start(self, devices: Sequence[Device]) -> None:
        self.steps.append("pre_start " + ",".join(d.id for d in devices))
        if self.refuse_pre_start:
            raise AllocationError("the firmware is not loaded")


class Seats(DraDriver):
    """A DRA driver with a seat per claim; a claim named in `failing` fails."""

    def __init__(self, steps: list[str], failing: set[str]) -> None:
        super().__init__(RESOURCE, [Device("seat-0"), Device("seat-1")], driver_name=DRIVER)
        self.steps = steps
        self.failing = failing

    async def prepare(self, claim: ClaimRef, devices: Sequence[Device]) -> ContainerEdits:
        self.steps.append(f"prepare {claim.name}")
        if claim.name in self.failing:
            raise ClaimError("the seat is broken")
        return ContainerEdits()

    async def unprepare(self, claim: ClaimRef, devices: Sequence[Device]) -> None:
        self.steps.append(f"unprepare {claim.name}")


@dataclass
class Claims:
    """The claims' objects, by name (a ClaimSource)."""

    objects: dict[str, Mapping[str, Any]] = field(default_factory=dict)

    async def get(self, claim: ClaimRef) -> Mapping[str, Any]:
        found = self.objects.get(claim.name)
        if found is None:
            raise ClaimError(f"ResourceClaim {claim.namespace}/{claim.name} not found")
        return found


def claim(name: str, device: str) -> dict[str, Any]:
    result = {"request": "seat", "driver": DRIVER, "pool": NODE, "device": device}
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def pod(count: int, claims: Sequence[str]) -> PodSpec:
    limits = {RESOURCE: str(count)} if count else {}
    parsed = parse_pod(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "uid": "uid-p"},
            "spec": {
                "resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims],
                "containers": [
                    {
                        "name": "app",
                        "image": "registry.example/app:1",
                        "resources": {"limits": limits, "claims": [{"name": c} for c in claims]},
                    }
                ],
            },
        }
    )
    assert isinstance(parsed, PodSpec)
    return parsed


@dataclass
class Outcome:
    admitted: Refusal | list[ContainerResult]
    steps: list[str]
    devices_in_use: set[str]
    prepared_claims: list[str]
    driver_holds: list[str]


async def admit(
    folder: Path,
    count: int,
    claims: Sequence[str],
    *,
    failing: set[str] = frozenset(),  # type: ignore[assignment]
    refuse_pre_start: bool = False,
    resources_refusal: tuple[str, str] | None = None,
) -> Outcome:
    """Admit a pod asking `count` devices and the seat claims `claims` on a node with
    two devices and two seats; what became of it and of the node."""
    steps: list[str] = []
    objects = Claims({"a": claim("a", "seat-0"), "b": claim("b", "seat-1")})

    listed = asyncio.Event()
    devices = DeviceManager(
        None,
        policy="none",
        numa_nodes=None,
        grace_period=300.0,
        dial_timeout=1.0,
        on_event=lambda kind, *_: listed.set() if kind == "devices" else None,
    )
    plugin = Acc(steps, refuse_pre_start)
    await plugin.scan()
    await devices.attach(RESOURCE, LocalEndpoint(plugin))
    await listed.wait()
    driver = Seats(steps, set(failing))
    await driver.scan()
    preparer = Preparer(DriverBinding.of(driver), NODE, objects, folder / "cdi", folder)
    endpoint = LocalDraEndpoint(preparer)
    prepared = PodClaims(objects.get, lambda name: endpoint if name == DRIVER else None)

    def check(_: PodSpec) -> tuple[str, str] | None:
        steps.append("resource check")
        return resources_refusal

    try:
        admitted = await admit_pod(pod(count, claims), devices, prepared, resource_check=check)
        return Outcome(
            admitted,
            steps,
            devices.in_use(RESOURCE),
            sorted(c.name for c in prepared.state.claims.values()),
            sorted(c.name for c in preparer.prepared.values()),
        )
    finally:
        await devices.close()


async def test_the_steps_run_in_the_kubelet_s_order(tmp_path: Path) -> None:
    outcome = await admit(tmp_path, 1, ["a", "b"])
    assert outcome.steps == [
        "resource check",
        "allocate acc-0",
        "prepare a",
        "prepare b",
        "pre_start acc-0",
    ]
    assert isinstance(outcome.admitted, list)
    [app] = outcome.admitted
    assert (app.name, app.state, app.devices) == ("app", STARTED, {RESOURCE: ["acc-0"]})
    # The runtime options carry the CDI devices of both claims, from the driver's specs.
    assert app.options.cdi_devices == [
        f"{DRIVER}/claim=uid-a-seat-0",
        f"{DRIVER}/claim=uid-b-seat-1",
    ]
    assert sorted(p.name for p in (tmp_path / "cdi").iterdir()) == [
        f"{DRIVER}-uid-a.json",
        f"{DRIVER}-uid-b.json",
    ]
    assert (outcome.devices_in_use, outcome.prepared_claims) == ({"acc-0"}, ["a", "b"])


async def test_a_claim_that_fails_to_prepare_undoes_the_claims_and_devices_before_it(
    tmp_path: Path,
) -> None:
    outcome = await admit(tmp_path, 1, ["a", "b"], failing={"b"})
    assert outcome.admitted == Refusal(
        DRA,
        REASON_FAILED_PREPARE,
        f"{DRIVER}: claim default/b: the seat is broken",
    )
    # Claim a, prepared first, is unprepared again; no container was started.
    assert outcome.steps == [
        "resource check",
        "allocate acc-0",
        "prepare a",
        "prepare b",
        "unprepare a",
    ]
    assert outcome.devices_in_use == set()
    assert (outcome.prepared_claims, outcome.driver_holds) == ([], [])
    assert list((tmp_path / "cdi").iterdir()) == []


async def test_a_claim_that_cannot_be_read_fails_as_the_kubelet_says(tmp_path: Path) -> None:
    outcome = await admit(tmp_path, 2, ["a", "gone"])
    assert outcome.admitted == Refusal(
        DRA, REASON_FAILED_PREPARE, "ResourceClaim default/gone not found"
    )
    assert outcome.steps[-2:] == ["prepare a", "unprepare a"]
    assert (outcome.devices_in_use, outcome.prepared_claims) == (set(), [])


async def test_the_device_manager_refuses_before_any_claim_is_prepared(tmp_path: Path) -> None:
    outcome = await admit(tmp_path, 3, ["a"])
    assert isinstance(outcome.admitted, Refusal)
    assert (outcome.admitted.step, outcome.admitted.reason) == (
        DEVICES,
        "UnexpectedAdmissionError",
    )
    assert outcome.steps == ["resource check"]
    assert (outcome.devices_in_use, outcome.prepared_claims) == (set(), [])


async def test_the_resource_check_refuses_before_the_device_manager(tmp_path: Path) -> None:
    refusal = ("OutOfcpu", "Node didn't have enough resource: cpu")
    outcome = await admit(tmp_path, 1, ["a"], resources_refusal=refusal)
    assert outcome.admitted == Refusal(RESOURCES, *refusal)
    assert outcome.steps == ["resource check"]
    assert (outcome.devices_in_use, outcome.prepared_claims) == (set(), [])


async def test_a_container_whose_pre_start_fails_waits_and_the_pod_keeps_what_it_holds(
    tmp_path: Path,
) -> None:
    outcome = await admit(tmp_path, 1, ["a"], refuse_pre_start=True)
    assert isinstance(outcome.admitted, list)
    [app] = outcome.admitted
    assert app.state == CREATE_CONTAINER_CONFIG_ERROR
    assert "the firmware is not loaded" in app.message
    assert outcome.steps == ["resource check", "allocate acc-0", "prepare a", "pre_start acc-0"]
    assert (outcome.devices_in_use, outcome.prepared_claims) == ({"acc-0"}, ["a"])
