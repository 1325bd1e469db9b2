"""Partitions and shared capacity on the node: the slices a config gives (counter sets
apart, the API's limits kept), the real daemon preparing partitions and shares for the
simulator's kubelet (claims from a folder, checked against the slices the daemon
writes there as the scheduler would), and the node plugin refusing a device or a
partition already prepared for another claim."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug.api.dra.v1 import api_pb2 as drapb
from devplug.api.dra.v1 import api_pb2_grpc as dragrpc
from devplug.framework.dra.slices import slice_bodies
from devplug.ground.channel import unix_channel
from devplug.simulator.results import REASON_UNSCHEDULABLE
from devplug.sources import ConfigError, build_plugins, parse_config
from devplug.sources.dradriver import config_driver
from tests.dra_helpers import NODE, Daemon, NodeDirs, claim_pod, kubelet_for, serve_command
from tests.hw_helpers import validate_cdi

FPGA = "fpga.example.com"
GPU = "gpu.example.com"
SHARE_A = "3f1c1d2e-0000-4000-8000-00000000000a"
SHARE_B = "3f1c1d2e-0000-4000-8000-00000000000b"


def partition_config(dirs: NodeDirs, devices: int = 1) -> Path:
    """An FPGA resource of 4-slot cards offered in partitions of 1, 2 and 4 slots, and a
    GPU resource shared by memory (1 GiB steps) and by a link's bandwidth."""
    for i in range(devices):
        dirs.make_device(f"fpga{i}")
    dirs.make_device("gpu0")
    fpga = {
        "name": "example.com/fpga",
        "mode": "dra",
        "allowAnyPath": True,
        "dra": {"driver": FPGA, "partitions": {"slots": 4, "sizes": [1, 2, 4]}},
        "groups": [
            {"id": f"fpga{i}", "paths": [{"path": str(dirs.dev / f"fpga{i}")}]}
            for i in range(devices)
        ],
    }
    gpu = {
        "name": "example.com/gpu",
        "mode": "dra",
        "allowAnyPath": True,
        "dra": {
            "driver": GPU,
            "consumableCapacity": {
                "memory": {
                    "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}
                },
                "bandwidth": {
                    "value": "100G",
                    "requestPolicy": {"default": "10G", "validValues": ["10G", "25G", "50G"]},
                },
            },
        },
        "groups": [
            {
                "id": "gpu0",
                "paths": [{"path": str(dirs.dev / "gpu0")}],
                "attributes": {"memory": 40 << 30},
            }
        ],
    }
    config = dirs.root / "config.yaml"
    config.write_text(yaml.safe_dump({"resources": [fpga, gpu]}))
    return config


def slices_of(config: Path, driver: str) -> list[dict[str, Any]]:
    for plugin in build_plugins(parse_config(config.read_text(), str(config))):
        candidate = config_driver(plugin)
        if candidate.name == driver:
            plugin.publish(plugin.discover())
            return slice_bodies(candidate, NODE, generation=1)
    raise AssertionError(driver)


def test_slot_partitions_consume_a_counter_set_in_a_slice_of_its_own(short_tmp: Path) -> None:
    config = partition_config(NodeDirs(short_tmp))
    counters, devices = slices_of(config, FPGA)
    assert counters["metadata"]["name"] == "node-a-fpga-example-com-counters-0"
    assert "devices" not in counters["spec"]
    assert counters["spec"]["sharedCounters"] == [
        {"name": "fpga0", "counters": {f"slot-{i}": {"value": "1"} for i in range(4)}}
    ]
    assert counters["spec"]["pool"] == devices["spec"]["pool"]
    assert devices["spec"]["pool"]["resourceSliceCount"] == 2
    published = {d["name"]: d for d in devices["spec"]["devices"]}
    assert sorted(published) == [
        "fpga0-slot-0",
        "fpga0-slot-1",
        "fpga0-slot-2",
        "fpga0-slot-3",
        "fpga0-slots-0-1",
        "fpga0-slots-0-3",
        "fpga0-slots-2-3",
    ]
    half = published["fpga0-slots-2-3"]
    assert half["consumesCounters"] == [
        {"counterSet": "fpga0", "counters": {"slot-2": {"value": "1"}, "slot-3": {"value": "1"}}}
    ]
    assert half["attributes"] == {"slots": {"int": 2}, "firstSlot": {"int": 2}}


def test_a_shared_device_is_published_once_with_its_request_policies(short_tmp: Path) -> None:
    config = partition_config(NodeDirs(short_tmp))
    [body] = slices_of(config, GPU)
    [gpu] = body["spec"]["devices"]
    assert gpu["allowMultipleAllocations"] is True
    assert gpu["capacity"] == {
        "memory": {
            "value": str(40 << 30),
            "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}},
        },
        "bandwidth": {
            "value": "100G",
            "requestPolicy": {"default": "10G", "validValues": ["10G", "25G", "50G"]},
        },
    }


def test_a_large_partitioned_pool_keeps_the_apis_limits(short_tmp: Path) -> None:
    """20 cards of 7 partitions: 140 partitions in slices of at most 64 (the limit for
    devices that consume counters), 20 counter sets in slices of at most 8."""
    config = partition_config(NodeDirs(short_tmp), devices=20)
    bodies = slices_of(config, FPGA)
    sets = [len(b["spec"]["sharedCounters"]) for b in bodies if "sharedCounters" in b["spec"]]
    devices = [len(b["spec"]["devices"]) for b in bodies if "devices" in b["spec"]]
    assert (sets, devices) == ([8, 8, 4], [64, 64, 12])
    assert {b["spec"]["pool"]["resourceSliceCount"] for b in bodies} == {6}
    assert len({b["metadata"]["name"] for b in bodies}) == 6


BASE = {"name": "example.com/acc", "virtual": 2, "mode": "dra"}


@pytest.mark.parametrize(
    ("dra", "extra", "message"),
    [
        (
            {"partitions": {"slots": 4, "sizes": [1, 2]}},
            {"mode": "both"},
            "resources[0].dra.partitions: needs mode: dra (a device plugin hands out whole "
            "devices, never partitions)",
        ),
        (
            {"partitions": {"slots": 4, "sizes": [1]}},
            {"count": 2},
            "resources[0].dra.partitions: not with 'count'",
        ),
        ({"partitions": {"slots": 33, "sizes": [1]}}, {}, "resources[0].dra.partitions.slots"),
        ({"partitions": {"slots": 4, "sizes": [8]}}, {}, "resources[0].dra.partitions.sizes[0]"),
        (
            {"partitions": {"slots": 4, "counters": {"a": 1}}},
            {},
            "resources[0].dra.partitions: expected 'slots' (with 'sizes') or 'counters'",
        ),
        (
            {
                "partitions": {
                    "counters": {"Region_A": 1},
                    "devices": [{"name": "x", "consumes": {}}],
                }
            },
            {},
            "resources[0].dra.partitions.counters.Region_A: counter name 'Region_A' must be "
            "a lower-case DNS label",
        ),
        (
            {
                "partitions": {
                    "counters": {"r0": 1},
                    "devices": [{"name": "a", "consumes": {"r1": 1}}],
                }
            },
            {},
            "resources[0].dra.partitions.devices[0].consumes.r1: no counter 'r1' in 'counters'",
        ),
        (
            {
                "partitions": {
                    "counters": {"r0": 1},
                    "devices": [{"name": "a", "consumes": {"r0": 2}}],
                }
            },
            {},
            "resources[0].dra.partitions.devices[0].consumes.r0: expected 1 to 1, got 2",
        ),
        (
            {"partitions": {"slots": 2, "sizes": [1]}, "consumableCapacity": {"memory": {}}},
            {},
            "resources[0].dra: both 'partitions' and 'consumableCapacity' are set",
        ),
        (
            {"consumableCapacity": {"bandwidth": {}}},
            {},
            "resources[0].dra.consumableCapacity.bandwidth.value: required",
        ),
        (
            {"consumableCapacity": {"bandwidth": {"value": "lots"}}},
            {},
            "resources[0].dra.consumableCapacity.bandwidth.value: 'lots' is not a quantity",
        ),
        (
            {
                "consumableCapacity": {
                    "memory": {
                        "requestPolicy": {
                            "default": "1Gi",
                            "validRange": {"min": "1Gi", "step": "0"},
                        }
                    }
                }
            },
            {},
            "resources[0].dra.consumableCapacity.memory.requestPolicy.validRange.step: "
            "expected a quantity > 0",
        ),
    ],
)
def test_bad_partitions_and_shares_give_one_line(
    dra: dict[str, Any], extra: dict[str, Any], message: str
) -> None:
    text = yaml.safe_dump({"resources": [{**BASE, **extra, "dra": dra}]})
    with pytest.raises(ConfigError) as error:
        parse_config(text, "c.yaml")
    assert str(error.value).startswith(f"c.yaml: {message}")
    assert "\n" not in str(error.value)


# -- on the node: the simulator's kubelet and the real daemon ------------------------


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


async def test_partitions_are_prepared_and_overlapping_ones_refused(dirs_root: NodeDirs) -> None:
    dirs = dirs_root
    config = partition_config(dirs)
    half = claim(dirs, "half", FPGA, {"device": "fpga0-slots-0-1"})
    claim(dirs, "one", FPGA, {"device": "fpga0-slot-1"})
    other = claim(dirs, "other", FPGA, {"device": "fpga0-slots-2-3"})

    async with kubelet_for(dirs) as kubelet:
        daemon = Daemon(serve_command(dirs, config), dirs.root / "daemon.log")
        try:
            await kubelet.wait_for_registration(FPGA)
            [first] = await kubelet.apply(pod("p-half", "half"))
            assert first.admitted, first.message
            assert first.containers[0].options.cdi_devices == [
                f"{FPGA}/claim={half}-fpga0-slots-0-1"
            ]
            body = spec(dirs, FPGA, half)
            [device] = body["devices"]
            nodes = [n["hostPath"] for n in device["containerEdits"]["deviceNodes"]]
            assert nodes == [str(dirs.dev / "fpga0")]
            assert "DEVPLUG_EXAMPLE_COM_FPGA=fpga0-slots-0-1" in body["containerEdits"]["env"]

            # Slot 1 is taken: the scheduler would never allocate it now.
            [second] = await kubelet.apply(pod("p-one", "one"))
            assert (second.admitted, second.reason) == (False, REASON_UNSCHEDULABLE)
            assert second.message == (
                "claim default/one: partition fpga0-slot-1 needs counter slot-1 of counter "
                "set fpga0 beyond its 1: it overlaps a partition already allocated"
            )
            # Nor does the driver prepare it, asked straight.
            errors = await prepare(dirs, FPGA, "one", "other")
            assert errors == {
                "one": f"partition fpga0-slot-1 overlaps fpga0-slots-0-1 of claim "
                f"default/half (UID {half}): counter slot-1 of fpga0 would be exceeded",
                "other": "",
            }
            assert not (dirs.cdi / f"{FPGA}-uid-one.json").exists()
            assert spec(dirs, FPGA, other)["devices"][0]["name"] == f"{other}-fpga0-slots-2-3"
            await unprepare(dirs, FPGA, "other")

            # The half gone, slot 1 is free again.
            assert await kubelet.delete_pod("p-half")
            assert not (dirs.cdi / f"{FPGA}-{half}.json").exists()
            [third] = await kubelet.apply(pod("p-one", "one"))
            assert third.admitted, third.message
        finally:
            daemon.stop()


def share(share_id: str, memory: str, bandwidth: str = "10G") -> dict[str, Any]:
    consumed = {"memory": memory, "bandwidth": bandwidth}
    return {"device": "gpu0", "shareID": share_id, "consumedCapacity": consumed}


async def test_shares_of_a_device_are_prepared_and_unprepared_each_alone(
    dirs_root: NodeDirs,
) -> None:
    dirs = dirs_root
    config = partition_config(dirs)
    first = claim(dirs, "share-a", GPU, share(SHARE_A, "30Gi"))
    second = claim(dirs, "share-b", GPU, share(SHARE_B, "10Gi", "25G"))
    claim(dirs, "too-much", GPU, share("3f1c1d2e-0000-4000-8000-00000000000c", "1Gi"))
    claim(dirs, "off-step", GPU, share("3f1c1d2e-0000-4000-8000-00000000000d", "1536Mi"))
    claim(dirs, "no-share-id", GPU, {"device": "gpu0", "consumedCapacity": {"memory": "1Gi"}})

    async with kubelet_for(dirs) as kubelet:
        daemon = Daemon(serve_command(dirs, config), dirs.root / "daemon.log")
        try:
            await kubelet.wait_for_registration(GPU)
            for name, uid, share_id, memory in (
                ("share-a", first, SHARE_A, "30Gi"),
                ("share-b", second, SHARE_B, "10Gi"),
            ):
                [result] = await kubelet.apply(pod(f"p-{name}", name))
                assert result.admitted, result.message
                cdi_name = f"{uid}-gpu0-{share_id}"
                assert result.containers[0].options.cdi_devices == [f"{GPU}/claim={cdi_name}"]
                [device] = spec(dirs, GPU, uid)["devices"]
                assert device["name"] == cdi_name
                env = device["containerEdits"]["env"]
                assert f"DEVPLUG_DRA_SHARE_GPU0={share_id}" in env
                assert f"DEVPLUG_DRA_SHARE_GPU0_MEMORY={memory}" in env
                nodes = [n["hostPath"] for n in device["containerEdits"]["deviceNodes"]]
                assert nodes == [str(dirs.dev / "gpu0")]

            refused = {}
            for name in ("too-much", "off-step", "no-share-id"):
                [result] = await kubelet.apply(pod(f"p-{name}", name))
                assert (result.admitted, result.reason) == (False, REASON_UNSCHEDULABLE)
                refused[name] = result.message
            gib = 1 << 30
            assert refused == {
                "too-much": f"claim default/too-much: memory of device gpu0: {40 * gib} of "
                f"{40 * gib} is allocated, {gib} more does not fit",
                "off-step": "claim default/off-step: memory of device gpu0: "
                f"{1536 << 20} is not min plus a number of steps",
                "no-share-id": "claim default/no-share-id: share of device gpu0 has no shareID",
            }

            # One share goes: the other keeps its spec; the freed memory is allocatable.
            assert await kubelet.delete_pod("p-share-a")
            assert not (dirs.cdi / f"{GPU}-{first}.json").exists()
            assert spec(dirs, GPU, second)["devices"][0]["name"].endswith(SHARE_B)
            [result] = await kubelet.apply(pod("p-too-much", "too-much"))
            assert result.admitted, result.message
        finally:
            daemon.stop()


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
