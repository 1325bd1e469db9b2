"""Partitions and shared capacity on the node: the real daemon preparing partitions and
shares for the simulator's kubelet (claims from a folder, checked against the slices
the daemon writes there as the scheduler would), and the node plugin refusing a device
or a partition already prepared for another claim. One node serves the partition and
share stories (module-scoped fixtures, in story order); each test checks one behaviour
of what they recorded."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from devplug.api.dra.v1 import api_pb2 as drapb
from devplug.api.dra.v1 import api_pb2_grpc as dragrpc
from devplug.ground.channel import unix_channel
from devplug.simulator import Kubelet, PodResult
from devplug.simulator.results import REASON_UNSCHEDULABLE
from tests.dra_helpers import (
    NODE,
    Daemon,
    NodeDirs,
    claim_pod,
    kubelet_for,
    serve_command,
    serving,
)
from tests.hw_helpers import validate_cdi
from tests.process.test_dra_partitions import FPGA, GPU, SHARE_A, SHARE_B, partition_config

# -- the simulator's kubelet and the real daemon ---------------------------------------


def claim(dirs: NodeDirs, name: str, driver: str, *results: dict[str, Any]) -> str:
    """Write an allocated claim (UID 'uid-<name>') with `results` of `driver` in our pool."""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "r"}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "r", "driver": driver, "pool": NODE, **result}
                        for result in results
                    ]
                }
            }
        },
    }
    dirs.claims.mkdir(exist_ok=True)
    (dirs.claims / f"{name}.yaml").write_text(yaml.safe_dump(body))
    return f"uid-{name}"


def pod(name: str, claim_name: str) -> dict[str, Any]:
    return claim_pod(name, claim_name, pod_claim="r")


async def prepare(dirs: NodeDirs, driver: str, *names: str) -> dict[str, str]:
    """NodePrepareResources of the claims `names`, straight to the node plugin: the
    error of each (empty when prepared)."""
    async with unix_channel(dirs.plugins / driver / "dra.sock") as channel:
        stub = dragrpc.DRAPluginStub(channel)
        claims = [drapb.Claim(namespace="default", uid=f"uid-{n}", name=n) for n in names]
        answer = await stub.NodePrepareResources(
            drapb.NodePrepareResourcesRequest(claims=claims), timeout=10
        )
    return {n: answer.claims[f"uid-{n}"].error for n in names}


async def unprepare(dirs: NodeDirs, driver: str, *names: str) -> None:
    async with unix_channel(dirs.plugins / driver / "dra.sock") as channel:
        stub = dragrpc.DRAPluginStub(channel)
        claims = [drapb.Claim(namespace="default", uid=f"uid-{n}", name=n) for n in names]
        answer = await stub.NodeUnprepareResources(
            drapb.NodeUnprepareResourcesRequest(claims=claims), timeout=10
        )
    assert {c.error for c in answer.claims.values()} == {""}


def spec(dirs: NodeDirs, driver: str, uid: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((dirs.cdi / f"{driver}-{uid}.json").read_text())
    validate_cdi(body)
    return body


# One node serves both stories (module-scoped fixtures, in story order, on the module's
# loop): partitions of a card, and shares of a GPU; each test checks one behaviour.
on_the_node = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def node(module_dirs: NodeDirs) -> AsyncIterator[Kubelet]:
    """The simulator's kubelet and the real daemon serving `partition_config`, both
    drivers registered."""
    async with serving(module_dirs, partition_config(module_dirs), FPGA, GPU) as kubelet:
        yield kubelet


# -- partitions --------------------------------------------------------------------------


@dataclass(frozen=True)
class HalfAdmitted:
    uid: str  # of the claim 'half', slots 0-1 of fpga0
    pod: PodResult
    spec: dict[str, Any]  # its CDI spec


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def half_admitted(node: Kubelet, module_dirs: NodeDirs) -> HalfAdmitted:
    """Claims for slots 0-1 ('half'), slot 1 ('one') and slots 2-3 ('other') of fpga0;
    the pod of 'half' applied."""
    dirs = module_dirs
    half = claim(dirs, "half", FPGA, {"device": "fpga0-slots-0-1"})
    claim(dirs, "one", FPGA, {"device": "fpga0-slot-1"})
    claim(dirs, "other", FPGA, {"device": "fpga0-slots-2-3"})
    [result] = await node.apply(pod("p-half", "half"))
    return HalfAdmitted(half, result, spec(dirs, FPGA, half) if result.admitted else {})


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def overlapping(node: Kubelet, half_admitted: HalfAdmitted) -> PodResult:
    """The pod of 'one' applied while 'half' holds slot 1."""
    [result] = await node.apply(pod("p-one", "one"))
    return result


@dataclass(frozen=True)
class AskedStraight:
    errors: dict[str, str]  # NodePrepareResources of 'one' and 'other', straight
    one_spec_written: bool
    other_spec: dict[str, Any]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def asked_straight(overlapping: PodResult, module_dirs: NodeDirs) -> AskedStraight:
    """'one' and 'other' prepared straight by the node plugin (then 'other' unprepared)."""
    dirs = module_dirs
    errors = await prepare(dirs, FPGA, "one", "other")
    written = (dirs.cdi / f"{FPGA}-uid-one.json").exists()
    other = spec(dirs, FPGA, "uid-other") if not errors["other"] else {}
    await unprepare(dirs, FPGA, "other")
    return AskedStraight(errors, written, other)


@dataclass(frozen=True)
class HalfGone:
    deleted: bool
    half_spec_left: bool
    one: PodResult  # the pod of 'one' applied again


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def half_gone(
    node: Kubelet, asked_straight: AskedStraight, half_admitted: HalfAdmitted, module_dirs: NodeDirs
) -> HalfGone:
    """The pod of 'half' deleted, then the pod of 'one' applied again."""
    deleted = await node.delete_pod("p-half")
    left = (module_dirs.cdi / f"{FPGA}-{half_admitted.uid}.json").exists()
    [result] = await node.apply(pod("p-one", "one"))
    return HalfGone(deleted, left, result)


@on_the_node
async def test_a_partition_is_admitted_with_a_cdi_device_of_its_own(
    half_admitted: HalfAdmitted,
) -> None:
    pod = half_admitted.pod
    assert pod.admitted, pod.message
    assert pod.containers[0].options.cdi_devices == [
        f"{FPGA}/claim={half_admitted.uid}-fpga0-slots-0-1"
    ]


@on_the_node
async def test_a_partitions_spec_gives_its_card_and_names_the_partition(
    half_admitted: HalfAdmitted, module_dirs: NodeDirs
) -> None:
    body = half_admitted.spec
    [device] = body["devices"]
    nodes = [n["hostPath"] for n in device["containerEdits"]["deviceNodes"]]
    assert nodes == [str(module_dirs.dev / "fpga0")]
    assert "DEVPLUG_EXAMPLE_COM_FPGA=fpga0-slots-0-1" in body["containerEdits"]["env"]


@on_the_node
async def test_a_partition_overlapping_an_allocated_one_is_unschedulable(
    overlapping: PodResult,
) -> None:
    """Slot 1 is taken: the scheduler would never allocate it now."""
    assert (overlapping.admitted, overlapping.reason) == (False, REASON_UNSCHEDULABLE)
    assert overlapping.message == (
        "claim default/one: partition fpga0-slot-1 needs counter slot-1 of counter "
        "set fpga0 beyond its 1: it overlaps a partition already allocated"
    )


@on_the_node
async def test_the_driver_asked_straight_refuses_an_overlapping_partition(
    asked_straight: AskedStraight, half_admitted: HalfAdmitted
) -> None:
    assert asked_straight.errors["one"] == (
        f"partition fpga0-slot-1 overlaps fpga0-slots-0-1 of claim "
        f"default/half (UID {half_admitted.uid}): counter slot-1 of fpga0 would be exceeded"
    )
    assert not asked_straight.one_spec_written


@on_the_node
async def test_the_driver_prepares_a_partition_beside_an_allocated_one(
    asked_straight: AskedStraight,
) -> None:
    assert asked_straight.errors["other"] == ""
    assert asked_straight.other_spec["devices"][0]["name"] == "uid-other-fpga0-slots-2-3"


@on_the_node
async def test_a_partition_freed_with_its_pod_lets_an_overlapping_one_in(
    half_gone: HalfGone,
) -> None:
    assert half_gone.deleted
    assert not half_gone.half_spec_left
    assert half_gone.one.admitted, half_gone.one.message


# -- shares --------------------------------------------------------------------------------


def share(share_id: str, memory: str, bandwidth: str = "10G") -> dict[str, Any]:
    consumed = {"memory": memory, "bandwidth": bandwidth}
    return {"device": "gpu0", "shareID": share_id, "consumedCapacity": consumed}


SHARES = {"share-a": (SHARE_A, "30Gi"), "share-b": (SHARE_B, "10Gi")}
REFUSED = ("too-much", "off-step", "no-share-id")


@dataclass(frozen=True)
class ShareAdmitted:
    uid: str
    pod: PodResult
    device: dict[str, Any]  # the one device of its CDI spec


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shares_admitted(node: Kubelet, module_dirs: NodeDirs) -> dict[str, ShareAdmitted]:
    """Claims of two shares of gpu0 (30 and 10 of its 40 GiB), and of three that do not
    fit ('too-much', 'off-step', 'no-share-id'); the pods of the two applied."""
    dirs = module_dirs
    uids = {
        "share-a": claim(dirs, "share-a", GPU, share(SHARE_A, "30Gi")),
        "share-b": claim(dirs, "share-b", GPU, share(SHARE_B, "10Gi", "25G")),
    }
    claim(dirs, "too-much", GPU, share("3f1c1d2e-0000-4000-8000-00000000000c", "1Gi"))
    claim(dirs, "off-step", GPU, share("3f1c1d2e-0000-4000-8000-00000000000d", "1536Mi"))
    claim(dirs, "no-share-id", GPU, {"device": "gpu0", "consumedCapacity": {"memory": "1Gi"}})
    admitted = {}
    for name, uid in uids.items():
        [result] = await node.apply(pod(f"p-{name}", name))
        devices = spec(dirs, GPU, uid)["devices"] if result.admitted else [{}]
        admitted[name] = ShareAdmitted(uid, result, devices[0] if len(devices) == 1 else {})
    return admitted


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shares_refused(
    node: Kubelet, shares_admitted: dict[str, ShareAdmitted]
) -> dict[str, PodResult]:
    """The pods of the three that do not fit, applied beside the two shares."""
    refused = {}
    for name in REFUSED:
        [refused[name]] = await node.apply(pod(f"p-{name}", name))
    return refused


@dataclass(frozen=True)
class ShareGone:
    deleted: bool
    spec_left: bool  # share-a's CDI spec
    other_spec: dict[str, Any]  # share-b's
    too_much: PodResult  # the pod of 'too-much' applied again


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def share_gone(
    node: Kubelet,
    shares_refused: dict[str, PodResult],
    shares_admitted: dict[str, ShareAdmitted],
    module_dirs: NodeDirs,
) -> ShareGone:
    """The pod of share-a deleted, then the pod of 'too-much' applied again."""
    deleted = await node.delete_pod("p-share-a")
    left = (module_dirs.cdi / f"{GPU}-{shares_admitted['share-a'].uid}.json").exists()
    other = spec(module_dirs, GPU, shares_admitted["share-b"].uid)
    [result] = await node.apply(pod("p-too-much", "too-much"))
    return ShareGone(deleted, left, other, result)


@on_the_node
@pytest.mark.parametrize("name", list(SHARES))
async def test_each_share_of_a_device_is_admitted_with_a_cdi_device_of_its_own(
    shares_admitted: dict[str, ShareAdmitted], name: str
) -> None:
    admitted = shares_admitted[name]
    share_id, _ = SHARES[name]
    assert admitted.pod.admitted, admitted.pod.message
    cdi_name = f"{admitted.uid}-gpu0-{share_id}"
    assert admitted.pod.containers[0].options.cdi_devices == [f"{GPU}/claim={cdi_name}"]
    assert admitted.device["name"] == cdi_name


@on_the_node
@pytest.mark.parametrize("name", list(SHARES))
async def test_a_shares_spec_gives_the_device_with_its_share_and_memory_in_the_environment(
    shares_admitted: dict[str, ShareAdmitted], module_dirs: NodeDirs, name: str
) -> None:
    device = shares_admitted[name].device
    share_id, memory = SHARES[name]
    env = device["containerEdits"]["env"]
    assert f"DEVPLUG_DRA_SHARE_GPU0={share_id}" in env
    assert f"DEVPLUG_DRA_SHARE_GPU0_MEMORY={memory}" in env
    nodes = [n["hostPath"] for n in device["containerEdits"]["deviceNodes"]]
    assert nodes == [str(module_dirs.dev / "gpu0")]


@on_the_node
async def test_shares_that_do_not_fit_are_unschedulable_each_with_its_reason(
    shares_refused: dict[str, PodResult],
) -> None:
    for result in shares_refused.values():
        assert (result.admitted, result.reason) == (False, REASON_UNSCHEDULABLE)
    gib = 1 << 30
    assert {name: result.message for name, result in shares_refused.items()} == {
        "too-much": f"claim default/too-much: memory of device gpu0: {40 * gib} of "
        f"{40 * gib} is allocated, {gib} more does not fit",
        "off-step": "claim default/off-step: memory of device gpu0: "
        f"{1536 << 20} is not min plus a number of steps",
        "no-share-id": "claim default/no-share-id: share of device gpu0 has no shareID",
    }


@on_the_node
async def test_a_share_is_unprepared_alone_and_the_other_keeps_its_spec(
    share_gone: ShareGone,
) -> None:
    assert share_gone.deleted
    assert not share_gone.spec_left
    assert share_gone.other_spec["devices"][0]["name"].endswith(SHARE_B)


@on_the_node
async def test_the_capacity_a_share_frees_is_allocatable_again(share_gone: ShareGone) -> None:
    assert share_gone.too_much.admitted, share_gone.too_much.message


async def test_a_device_prepared_for_one_claim_is_refused_to_another(dirs_root: NodeDirs) -> None:
    """Double allocation (the scheduler's race, or a pod force-deleted while its
    container runs): the node plugin refuses, per claim, a device that is not
    shareable and already prepared for a claim not yet unprepared."""
    dirs = dirs_root
    config = partition_config(dirs)
    first = claim(dirs, "first", FPGA, {"device": "fpga0-slots-0-3"})
    claim(dirs, "second", FPGA, {"device": "fpga0-slots-0-3"})
    claim(dirs, "admin", FPGA, {"device": "fpga0-slots-0-3", "adminAccess": True})
    claim(dirs, "shares", GPU, share(SHARE_A, "1Gi"))
    claim(dirs, "more-shares", GPU, share(SHARE_B, "1Gi"))

    async with kubelet_for(dirs) as kubelet:
        daemon = Daemon(serve_command(dirs, config), dirs.root / "daemon.log")
        try:
            await kubelet.wait_for_registration(FPGA)
            await kubelet.wait_for_registration(GPU)
            assert await prepare(dirs, FPGA, "first") == {"first": ""}
            assert await prepare(dirs, FPGA, "second", "admin") == {
                "second": f"device fpga0-slots-0-3 is already prepared for claim "
                f"default/first (UID {first}) and is not shareable: it is free once that "
                "claim is unprepared",
                "admin": "",
            }
            # Prepare stays idempotent for the claim that holds it.
            assert await prepare(dirs, FPGA, "first") == {"first": ""}
            await unprepare(dirs, FPGA, "first")
            assert await prepare(dirs, FPGA, "second") == {"second": ""}
            # Shares of a shared device are never in each other's way.
            assert await prepare(dirs, GPU, "shares", "more-shares") == {
                "shares": "",
                "more-shares": "",
            }
        finally:
            daemon.stop()


@pytest.fixture
def dirs_root(short_tmp: Path) -> NodeDirs:
    return NodeDirs(short_tmp)
