"""Pod admission on the simulated kubelet, with real plugin processes."""

from __future__ import annotations

import collections
import random
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from sim_helpers import BAR, FOO, PluginProcess, device, plugin, pod, pods_yaml

from devplug.simulator import (
    REASON_ALREADY_EXISTS,
    REASON_INVALID,
    REASON_TOPOLOGY_AFFINITY,
    REASON_UNEXPECTED_ADMISSION,
    Kubelet,
    PodResult,
    checkpoint,
)


@asynccontextmanager
async def node(
    tmp_path: Path, plugins: list[dict[str, Any]], **options: Any
) -> AsyncIterator[Kubelet]:
    plugin_dir = tmp_path / "plugins"
    async with Kubelet(plugin_dir, tmp_path / "state", **options) as kubelet:
        with PluginProcess(tmp_path, plugin_dir, plugins):
            for spec in plugins:
                healthy = sum(1 for d in spec["devices"] if d["healthy"])
                await kubelet.wait_for_resource(spec["resource"], count=healthy)
            yield kubelet


def admitted(result: PodResult) -> dict[str, dict[str, list[str]]]:
    assert result.admitted, f"{result.reason}: {result.message}"
    return {c.name: c.devices for c in result.containers}


async def test_not_enough_devices_and_deletion(tmp_path: Path) -> None:
    async with node(
        tmp_path, [plugin(FOO, [device("d0"), device("d1"), device("d2", healthy=False)])]
    ) as kubelet:
        status = kubelet.resource_status(FOO)
        assert status is not None
        assert (status.capacity, status.allocatable) == (3, 2)
        [big] = await kubelet.apply(pod("big", {"c": {FOO: 3}}))
        assert (big.admitted, big.reason) == (False, REASON_UNEXPECTED_ADMISSION)
        assert big.message == (
            "Allocate failed due to requested number of devices unavailable for "
            "example.com/foo. Requested: 3, Available: 2, which is unexpected"
        )
        one, two = await kubelet.apply(
            pods_yaml(pod("one", {"c": {FOO: 1}}), pod("two", {"c": {FOO: 2}}))
        )
        assert admitted(one) == {"c": {FOO: ["d0"]}}  # the plugin's order
        assert two.message.endswith("Requested: 2, Available: 1, which is unexpected")
        assert kubelet.pod("two") is None  # a rejected pod is not kept...
        assert kubelet.resource_status(FOO).allocated == 1  # type: ignore[union-attr]
        # The same pod again: unchanged, as kubectl says; another one of that name: refused.
        [again] = await kubelet.apply(pod("one", {"c": {FOO: 1}}))
        assert (again.admitted, again.unchanged, admitted(again)) == (True, True, admitted(one))
        assert kubelet.resource_status(FOO).allocated == 1  # type: ignore[union-attr]
        [other] = await kubelet.apply(pod("one", {"c": {FOO: 2}}))
        assert (other.admitted, other.reason) == (False, REASON_ALREADY_EXISTS)
        assert other.message.startswith('pods "one" already exists with another spec')
        # A pod whose second container cannot be served gives back the first one's.
        [partial] = await kubelet.apply(pod("partial", {"a": {FOO: 1}, "b": {FOO: 1}}))
        assert partial.message.endswith("Requested: 1, Available: 0, which is unexpected")
        assert kubelet.resource_status(FOO).allocated == 1  # type: ignore[union-attr]
        assert await kubelet.delete_pod("one")
        assert not await kubelet.delete_pod("one")
        [two] = await kubelet.apply(pod("two", {"c": {FOO: 2}}))
        assert admitted(two) == {"c": {FOO: ["d0", "d1"]}}


async def test_requests_different_from_limits_are_refused(tmp_path: Path) -> None:
    async with node(tmp_path, [plugin(FOO, [device("d0"), device("d1")])]) as kubelet:
        results = await kubelet.apply(
            [
                pod("more", {"c": {FOO: 1}}, requests={"c": {FOO: 2}}),
                pod("only", {"c": {}}, requests={"c": {FOO: 1}}),
            ]
        )
        assert [(r.admitted, r.reason) for r in results] == [(False, REASON_INVALID)] * 2
        assert results[0].message == (
            'Pod "more" is invalid: spec.containers[0].resources.requests: Invalid value: '
            '"2": must be equal to example.com/foo limit of 1'
        )
        assert kubelet.resource_status(FOO).allocated == 0  # type: ignore[union-attr]
        [ok] = await kubelet.apply(pod("ok", {"c": {FOO: 2}}, requests={"c": {FOO: 2}}))
        assert admitted(ok) == {"c": {FOO: ["d0", "d1"]}}


async def test_init_containers_hand_their_devices_on(tmp_path: Path) -> None:
    devices = [device(f"d{i}") for i in range(3)]
    async with node(tmp_path, [plugin(FOO, devices)]) as kubelet:
        [first] = await kubelet.apply(pod("reuse", {"app": {FOO: 2}}, init={"setup": {FOO: 2}}))
        assert admitted(first) == {"setup": {FOO: ["d0", "d1"]}, "app": {FOO: ["d0", "d1"]}}
        # Allocate is called once per container, reused devices included.
        assert kubelet.node_status().alloc_duration[FOO].count == 2
        assert kubelet.resource_status(FOO).allocated == 2  # type: ignore[union-attr]
        # A sidecar (restartable init container) keeps its device.
        [sidecar] = await kubelet.apply(
            pod("side", {"app": {FOO: 1}}, init={"proxy": {FOO: 1}}, sidecars=["proxy"])
        )
        assert sidecar.reason == REASON_UNEXPECTED_ADMISSION
        assert "Requested: 1, Available: 0" in sidecar.message
        assert await kubelet.delete_pod("reuse")
        [sidecar] = await kubelet.apply(
            pod("side", {"app": {FOO: 1}}, init={"proxy": {FOO: 1}}, sidecars=["proxy"])
        )
        assert admitted(sidecar) == {"proxy": {FOO: ["d0"]}, "app": {FOO: ["d1"]}}


async def test_preferred_allocation_is_honoured(tmp_path: Path) -> None:
    devices = [device(f"d{i}") for i in range(4)]
    plugins = [
        plugin(FOO, devices, preferred="reverse"),
        plugin(BAR, [device(f"b{i}") for i in range(4)]),
    ]
    async with node(tmp_path, plugins) as kubelet:
        assert kubelet.resource_status(FOO).preferred_allocation  # type: ignore[union-attr]
        [result] = await kubelet.apply(pod("p", {"c": {FOO: 2, BAR: 2}}))
        # The plugin's choice (the last devices) against the default order (the first).
        assert admitted(result) == {"c": {FOO: ["d3", "d2"], BAR: ["b0", "b1"]}}
        [again] = await kubelet.apply(pod("q", {"c": {FOO: 1}}))
        assert admitted(again) == {"c": {FOO: ["d1"]}}


async def test_pre_start_container_and_runtime_options(tmp_path: Path) -> None:
    log = tmp_path / "pre-start.log"
    foo = [
        device("g0", nodes=["/dev/g0"], env={"GPUS": "g0"}, cdi=["example.com/gpu=g0"]),
        device("g1", nodes=["/dev/g1"], env={"GPUS": "g1"}, cdi=["example.com/gpu=g1"]),
        device("g2", nodes=["/dev/g2"], env={"GPUS": "g2"}, annotations={"a": "1"}),
    ]
    bar = [device("n0", mounts=["/opt/lib"], env={"GPUS": "other", "NIC": "n0"})]
    plugins = [plugin(FOO, foo, pre_start_log=str(log)), plugin(BAR, bar)]
    async with node(tmp_path, plugins) as kubelet:
        [result] = await kubelet.apply(
            pod("p", {"app": {FOO: 2, BAR: 1}}, init={"setup": {FOO: 1}})
        )
        setup, app = result.containers
        assert (setup.state, setup.pre_started) == ("Started", [FOO])
        assert (app.state, app.pre_started) == ("Started", [FOO])
        # Before each container start, with that container's devices.
        assert log.read_text().splitlines() == ["g0", "g0,g1"]
        options = app.options
        assert [(d.host_path, d.container_path, d.permissions) for d in options.devices] == [
            ("/dev/g0", "/dev/g0", "rw"),
            ("/dev/g1", "/dev/g1", "rw"),
        ]
        assert [(m.host_path, m.read_only) for m in options.mounts] == [("/opt/lib", True)]
        # Merged over resources in name order (bar first): the first value wins.
        assert [(e.name, e.value) for e in options.envs] == [("GPUS", "other"), ("NIC", "n0")]
        assert options.cdi_devices == ["example.com/gpu=g0", "example.com/gpu=g1"]


async def test_failing_pre_start_keeps_the_container_from_starting(tmp_path: Path) -> None:
    log = tmp_path / "pre-start.log"
    plugins = [
        plugin(FOO, [device("g0"), device("g1")], pre_start_log=str(log), pre_start_fail=True)
    ]
    async with node(tmp_path, plugins) as kubelet:
        [result] = await kubelet.apply(pod("p", {"app": {FOO: 1}}, init={"setup": {FOO: 1}}))
        assert result.admitted  # admission passed; the start failed
        setup, app = result.containers
        assert setup.state == "CreateContainerConfigError"
        assert setup.message == (
            "device plugin PreStartContainer rpc failed with err: rpc error: "
            "code = InvalidArgument desc = device is still resetting"
        )
        assert app.state == "Waiting"
        assert log.read_text().splitlines() == ["g0"]


# Three devices: two on NUMA node 0, one on node 1.
NUMA_DEVICES = [device("n0a", [0]), device("n0b", [0]), device("n1a", [1])]
# policy -> (three devices in one pod admitted?, two devices split over nodes admitted?)
EXPECTED = {
    "none": (True, True),
    "best-effort": (True, True),
    "restricted": (True, False),
    "single-numa-node": (False, False),
}


@pytest.fixture(scope="module")
def numa_plugins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One plugin process for every policy: each kubelet cleans the folder at start and
    the plugin registers with it again."""
    tmp = tmp_path_factory.mktemp("numa")
    plugin_dir = tmp / "plugins"
    with PluginProcess(tmp, plugin_dir, [plugin(FOO, NUMA_DEVICES)]):
        yield plugin_dir


@pytest.mark.parametrize("policy", list(EXPECTED))
async def test_topology_policies(tmp_path: Path, numa_plugins: Path, policy: str) -> None:
    three_ok, split_ok = EXPECTED[policy]

    async with Kubelet(
        numa_plugins, tmp_path, topology_policy=policy, numa_nodes=2, control_socket=False
    ) as kubelet:
        await kubelet.wait_for_resource(FOO, count=3, timeout=20)
        [three] = await kubelet.apply(pod("three", {"c": {FOO: 3}}))
        assert three.admitted is three_ok, three.message
        if not three_ok:
            assert (three.reason, three.message) == (
                REASON_TOPOLOGY_AFFINITY,
                "Resources cannot be allocated with Topology locality",
            )
            assert kubelet.resource_status(FOO).allocated == 0  # type: ignore[union-attr]
        await kubelet.delete_pod("three")
        # One device: node 0 is narrowest (or first, with no policy): n0a.
        [one] = await kubelet.apply(pod("one", {"c": {FOO: 1}}))
        assert admitted(one) == {"c": {FOO: ["n0a"]}}
        # Two more: only n0b + n1a are left, which spans both nodes.
        [split] = await kubelet.apply(pod("split", {"c": {FOO: 2}}))
        assert split.admitted is split_ok, split.message
        if split_ok:
            assert admitted(split) == {"c": {FOO: ["n0b", "n1a"]}}
        else:
            assert split.reason == REASON_TOPOLOGY_AFFINITY
        # Whatever the policy, a pod that fits one node lands on one node.
        await kubelet.delete_pod("one")
        await kubelet.delete_pod("split")
        [pair] = await kubelet.apply(pod("pair", {"c": {FOO: 2}}))
        assert admitted(pair) == {"c": {FOO: ["n0a", "n0b"]}}


async def test_best_effort_prefers_the_node_with_room(tmp_path: Path) -> None:
    devices = [device("a0", [0]), device("b0", [1]), device("b1", [1])]
    async with node(tmp_path, [plugin(FOO, devices)], topology_policy="best-effort") as kubelet:
        [first] = await kubelet.apply(pod("first", {"c": {FOO: 2}}))
        # Without a policy the first two listed (a0, b0) would be taken.
        assert admitted(first) == {"c": {FOO: ["b0", "b1"]}}


async def test_plugin_errors_reject_the_pod(tmp_path: Path) -> None:
    plugins = [
        plugin(FOO, [device("d0")], allocate_fail="out of coffee"),
        plugin(BAR, [device("b0"), device("b1")], preferred="fail"),
    ]
    async with node(tmp_path, plugins) as kubelet:
        [foo] = await kubelet.apply(pod("foo", {"c": {FOO: 1}}))
        assert (foo.admitted, foo.reason) == (False, REASON_UNEXPECTED_ADMISSION)
        assert foo.message == (
            "Allocate failed due to rpc error: code = InvalidArgument desc = out of coffee, "
            "which is unexpected"
        )
        assert kubelet.node_status().alloc_duration[FOO].count == 1
        [bar] = await kubelet.apply(pod("bar", {"c": {BAR: 1}}))
        assert bar.message == (
            "Allocate failed due to device plugin GetPreferredAllocation rpc failed with "
            "err: rpc error: code = InvalidArgument desc = no opinion today, which is "
            "unexpected"
        )
        # No Allocate call was made for it, and nothing is held.
        assert BAR not in kubelet.node_status().alloc_duration
        assert [r.allocated for r in kubelet.node_status().resources] == [0, 0]
        # A pod asking for a resource no plugin ever registered is not the device
        # manager's business: the kubelet admits it (the scheduler would not place it).
        [other] = await kubelet.apply(pod("other", {"c": {"example.com/none": 1}}))
        assert admitted(other) == {"c": {}}


async def test_devices_in_use_follow_admissions_and_deletions(tmp_path: Path) -> None:
    """What the device manager keeps to answer fast (devices in use, available devices,
    the checkpoint's entries) agrees, after every step of random admissions (init
    containers, sidecars, rejections) and deletions, with a scan of its allocations."""
    rng = random.Random(3)
    devices = [device(f"d{i}", [i % 2]) for i in range(6)]

    def scan(manager: Any, resource: str) -> set[str]:
        return {
            d
            for containers in manager.pod_devices.values()
            for held in containers.values()
            if resource in held
            for d in held[resource].ids()
        }

    async with node(tmp_path, [plugin(FOO, devices), plugin(BAR, devices[:2])]) as kubelet:
        manager = kubelet._manager
        names: list[str] = []
        seen: collections.Counter[str] = collections.Counter()
        for step in range(60):
            if names and rng.random() < 0.35:
                assert await kubelet.delete_pod(names.pop(rng.randrange(len(names))))
                seen["deleted"] += 1
            else:
                name = f"p{step}"
                init = {"i": {FOO: rng.randrange(3)}} if rng.random() < 0.5 else None
                sidecars = ["i"] if init and rng.random() < 0.5 else []
                app = {"c": {FOO: rng.randrange(1, 3), BAR: rng.randrange(2)}}
                [result] = await kubelet.apply(pod(name, app, init, sidecars=sidecars))
                if result.admitted:
                    names.append(name)
                seen["admitted" if result.admitted else "rejected"] += 1
            for resource, listed in ((FOO, devices), (BAR, devices[:2])):
                used = scan(manager, resource)
                assert manager.in_use(resource) == used, step
                free = [d["id"] for d in listed if d["id"] not in used]
                assert manager.available(resource) == free, step
            assert manager.checkpoint_data() == checkpoint.read(kubelet.checkpoint_path)
        assert min(seen.values()) >= 5, seen
