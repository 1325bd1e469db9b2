"""`devplug fleet` without an API server: the fleet file and its one-line errors, the
in-process endpoint against the plugin served on a real socket, and a node's admission
with the kubelet's reasons."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from sim_helpers import devplug

from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.fleet.hardware import build_pool
from devplug.fleet.local import LocalEndpoint
from devplug.fleet.node import FleetNode
from devplug.fleet.spec import load_fleet, parse_fleet
from devplug.framework.servicer import DevicePluginServicer
from devplug.ground.unixserver import UnixServer
from devplug.simulator.endpoint import Endpoint, EndpointError
from devplug.sources import ConfigError, build_plugins, parse_config

NUMA_POOL = {
    "name": "numa",
    "count": 2,
    "cpu": "4",
    "memory": "8Gi",
    "pods": 3,
    "topologyPolicy": "single-numa-node",
    "config": {
        "resources": [
            {
                "name": "example.com/acc",
                "groups": [
                    {"paths": [{"path": "/dev/null"}], "numaNode": 0},
                    {"paths": [{"path": "/dev/zero"}], "numaNode": 1},
                ],
            }
        ]
    },
}
GPU_POOL = {
    "name": "h100",
    "count": 1,
    "gpus": {"count": 4, "numaNodes": 2},
    "config": {"resources": [{"nvidia": {"replicas": 2, "failRequestsGreaterThanOne": True}}]},
}


def fleet_text(*pools: dict[str, Any]) -> str:
    return yaml.safe_dump({"name": "t", "pools": list(pools)})


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_fleet(text, "fleet.yaml")
    message = str(caught.value)
    assert "\n" not in message
    return message


# -- the fleet file -------------------------------------------------------------------


def test_a_fleet_file_names_its_nodes_per_pool(tmp_path: Path) -> None:
    (tmp_path / "acc.yaml").write_text(yaml.safe_dump(NUMA_POOL["config"]))
    path = tmp_path / "Big Fleet.yaml"
    other = {"name": "other", "count": 3, "namePrefix": "x-", "configFile": "acc.yaml"}
    path.write_text(yaml.safe_dump({"pools": [NUMA_POOL, other]}))
    fleet = load_fleet(path)
    assert fleet.name == "big-fleet"
    assert [p.nodes for p in fleet.pools] == [("numa-0", "numa-1"), ("x-0", "x-1", "x-2")]
    assert fleet.node_count == 5
    assert fleet.pool("other").config.resources[0].name == "example.com/acc"


@pytest.mark.parametrize(
    ("pool", "expected"),
    [
        (dict(NUMA_POOL, count=0), "fleet.yaml: pools[0] (numa).count: expected an integer"),
        (
            dict(NUMA_POOL, config={"resources": [{"name": "example.com/x", "virtual": 0}]}),
            "fleet.yaml: pools[0] (numa).config: resources[0].virtual: expected an integer >= 1",
        ),
        (
            dict(NUMA_POOL, config={"resources": [{"name": "nodomain", "virtual": 1}]}),
            "fleet.yaml: pools[0] (numa).config: resources[0].name: 'nodomain' has no vendor",
        ),
        (dict(NUMA_POOL, cpu="lots"), "fleet.yaml: pools[0] (numa).cpu: quantities must match"),
        (dict(NUMA_POOL, topologyPolicy="tight"), "pools[0] (numa).topologyPolicy: expected one"),
        (dict(NUMA_POOL, colour="red"), "fleet.yaml: pools[0] (numa).colour: unknown key"),
        (
            dict(NUMA_POOL, taints=[{"key": "a", "effect": "Never"}]),
            "fleet.yaml: pools[0] (numa).taints[0].effect: Invalid enum value 'Never'",
        ),
        (
            {"name": "g", "config": GPU_POOL["config"]},
            "fleet.yaml: pools[0] (g).gpus: required: the config serves NVIDIA GPUs",
        ),
        (
            dict(GPU_POOL, gpus={"mig": ["huge"]}),
            "fleet.yaml: pools[0] (h100).gpus.mig: H100-SXM5-80GB has no MIG profile 'huge'",
        ),
        (
            dict(GPU_POOL, gpus={"model": "Voodoo5"}),
            "fleet.yaml: pools[0] (h100).gpus.model: unknown GPU model 'Voodoo5'",
        ),
        (
            dict(NUMA_POOL, configFile="missing.yaml"),
            "fleet.yaml: pools[0] (numa): expected one of 'config' (inline) or 'configFile'",
        ),
        ({"name": "n", "configFile": "missing.yaml"}, "pools[0] (n).configFile: cannot read"),
    ],
)
def test_a_bad_pool_names_the_file_the_pool_and_the_field(
    pool: dict[str, Any], expected: str
) -> None:
    assert expected in error_of(fleet_text(pool))


def test_a_bad_config_file_of_a_pool_names_both_files(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("resources:\n  - name: example.com/x\n    count: 0\n")
    text = fleet_text({"name": "p", "configFile": "bad.yaml"})
    with pytest.raises(ConfigError) as caught:
        parse_fleet(text, "fleet.yaml", tmp_path)
    assert str(caught.value).startswith(
        f"fleet.yaml: pools[0] (p).configFile: {tmp_path / 'bad.yaml'}: resources[0].count:"
    )


def test_pools_must_not_share_names_or_nodes() -> None:
    assert "pools[1] (numa).name: pool 'numa' is already pools[0]" in error_of(
        fleet_text(NUMA_POOL, NUMA_POOL)
    )
    clash = dict(NUMA_POOL, name="other", namePrefix="numa-")
    assert "pools[1] (other).namePrefix: node 'numa-0' is also a node of pools[0]" in error_of(
        fleet_text(NUMA_POOL, clash)
    )


def test_fleet_check_prints_one_line_for_a_bad_file_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(fleet_text(dict(NUMA_POOL, pods=0)))
    done = devplug("fleet", "check", "-f", str(path))
    assert done.returncode == 2
    assert done.stderr == (
        f"devplug fleet: {path}: pools[0] (numa).pods: expected an integer >= 1, got 0\n"
    )
    assert "Traceback" not in done.stderr


def test_fleet_check_shows_what_each_pool_serves(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(fleet_text(NUMA_POOL, dict(GPU_POOL, config={"resources": [{"nvidia": {}}]})))
    done = devplug("fleet", "check", "-f", str(path), "-o", "json")
    assert done.returncode == 0, done.stderr
    records = [yaml.safe_load(line) for line in done.stdout.splitlines()]
    assert [(r["pool"], r["nodes"], r["devicePlugins"]) for r in records] == [
        ("numa", 2, {"example.com/acc": 2}),
        ("h100", 1, {"nvidia.com/gpu": 4}),
    ]


# -- the in-process endpoint ------------------------------------------------------------


async def test_the_local_endpoint_answers_as_the_plugin_on_its_socket(short_tmp: Path) -> None:
    """Same plugin, same calls: over a real unix socket through the simulator's gRPC
    endpoint, and in-process; the answers and the refusals' texts are the same."""
    config = parse_config(yaml.safe_dump(NUMA_POOL["config"]))
    [plugin] = build_plugins(config)
    plugin.publish(plugin.discover())
    ids = list(plugin.devices)

    async def calls(endpoint: Endpoint) -> list[Any]:
        answers: list[Any] = []
        response = await endpoint.allocate(ids[:1])
        answers.append(response.SerializeToString(deterministic=True))
        answers.append(await endpoint.preferred(ids, [], 1))
        for bad in (["nope"], [ids[0], ids[0]]):
            with pytest.raises(EndpointError) as caught:
                await endpoint.allocate(bad)
            answers.append(str(caught.value))
        with pytest.raises(EndpointError) as caught:
            await endpoint.preferred(ids, ["nope"], 1)
        answers.append(str(caught.value))
        return answers

    socket = short_tmp / "p.sock"
    servicer = DevicePluginServicer(plugin)
    server = UnixServer(socket, lambda s: pb_grpc.add_DevicePluginServicer_to_server(servicer, s))
    await server.start()
    try:
        remote = await Endpoint.connect(plugin.resource_name, socket, 5.0)
        try:
            over_socket = await calls(remote)
        finally:
            await remote.close()
    finally:
        await server.stop(grace=0)
    local = await calls(LocalEndpoint(plugin))
    assert local == over_socket
    assert local[2] == (
        "rpc error: code = InvalidArgument desc = container request 0: unknown device IDs: nope"
    )


# -- admission on one node ----------------------------------------------------------------


def pod(name: str, limits: dict[str, Any], **requests: str) -> dict[str, Any]:
    resources: dict[str, Any] = {"limits": limits}
    if requests:
        resources["requests"] = requests
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": resources}]},
    }


StartNode = Callable[[dict[str, Any]], Awaitable[FleetNode]]


@pytest.fixture
async def start_node(tmp_path: Path) -> AsyncIterator[StartNode]:
    """Start the first node of a pool; every node started is stopped afterwards."""
    started: list[FleetNode] = []

    async def start(pool_doc: dict[str, Any]) -> FleetNode:
        [pool] = parse_fleet(fleet_text(pool_doc), "fleet.yaml").pools
        node = FleetNode(pool.nodes[0], build_pool(pool, tmp_path), tmp_path)
        await node.start()
        started.append(node)
        return node

    yield start
    for node in started:
        await node.stop()


async def test_a_node_admits_as_the_kubelet_and_says_why_not(start_node: StartNode) -> None:
    node = await start_node(NUMA_POOL)
    # Two devices on two NUMA nodes: single-numa-node refuses the pod.
    refused = await node.admit(pod("two", {"example.com/acc": 2}), {})
    admitted = await node.admit(pod("one", {"example.com/acc": 1}, cpu="1"), {})
    one = (admitted.admitted, admitted.status["phase"], admitted.devices)
    two = (refused.admitted, refused.status, refused.event)
    # What the node holds now: one of two devices.
    more = (await node.admit(pod("more", {"example.com/acc": 2}), {})).status["message"]
    hungry = (await node.admit(pod("hungry", {}, cpu="3500m"), {})).status
    third = await node.admit(pod("third", {}), {})
    fourth = await node.admit(pod("fourth", {}), {})
    fifth = await node.admit(pod("fifth", {}), {})  # 3 pods at most
    pods = (third.admitted, fourth.admitted, fifth.status["reason"])
    await node.release("uid-one")
    readmitted = await node.admit(pod("again", {"example.com/acc": 1}), {})
    again = (readmitted.admitted, node.used())
    assert one == (True, "Running", {"c": {"example.com/acc": ["null"]}})
    assert two == (
        False,
        {
            "phase": "Failed",
            "reason": "TopologyAffinityError",
            "message": "Pod was rejected: Resources cannot be allocated with Topology locality",
        },
        ("TopologyAffinityError", "Resources cannot be allocated with Topology locality"),
    )
    assert more == (
        "Pod was rejected: Node didn't have enough resource: example.com/acc, requested: 2, "
        "used: 1, capacity: 2"
    )
    assert hungry == {
        "phase": "Failed",
        "reason": "OutOfcpu",
        "message": "Pod was rejected: Node didn't have enough resource: cpu, requested: 3500, "
        "used: 1000, capacity: 4000",
    }
    assert pods == (True, True, "OutOfpods")
    assert again == (True, {"pods": 3, "example.com/acc": 1})


async def test_a_refused_allocate_fails_the_pod_with_unexpected_admission_error(
    start_node: StartNode,
) -> None:
    node = await start_node(GPU_POOL)
    result = await node.admit(pod("greedy", {"nvidia.com/gpu": 2}), {})
    ok = (await node.admit(pod("modest", {"nvidia.com/gpu": 1}), {})).admitted
    in_use = node.devices_in_use("nvidia.com/gpu")
    assert result.status["reason"] == "UnexpectedAdmissionError"
    assert result.status["message"].startswith(
        "Pod was rejected: Allocate failed due to rpc error: code = InvalidArgument desc = "
        "2 replicas of nvidia.com/gpu requested by one container"
    )
    assert result.status["message"].endswith(", which is unexpected")
    assert (ok, in_use) == (True, 1)
