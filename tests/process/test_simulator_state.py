"""What the simulated kubelet keeps: the checkpoint, and the PodResources API."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import grpc
import pytest
from sim_helpers import FOO, PluginProcess, device, plugin, pod

from devplug.api.podresources.v1 import api_pb2 as pr
from devplug.api.podresources.v1 import api_pb2_grpc as pr_grpc
from devplug.api.v1beta1 import api_pb2 as pb
from devplug.ground.channel import unix_channel
from devplug.simulator import Kubelet, checkpoint


async def test_restart_restores_allocations_without_double_allocation(tmp_path: Path) -> None:
    plugins, state = tmp_path / "plugins", tmp_path / "state"
    devices = [device(f"d{i}", [i % 2], env={"DEV": f"d{i}"}) for i in range(3)]
    with PluginProcess(tmp_path, plugins, [plugin(FOO, devices)]):
        async with Kubelet(plugins, state, grace_period=30) as first:
            await first.wait_for_resource(FOO, count=3)
            [held] = await first.apply(pod("held", {"c": {FOO: 2}}))
            assert held.containers[0].devices == {FOO: ["d0", "d1"]}
        # The file is the kubelet's: layout, NUMA keys, AllocResp, checksum.
        raw = json.loads((state / "kubelet_internal_checkpoint").read_text())
        [entry] = raw["Data"]["PodDeviceEntries"]
        assert entry["PodUID"] == held.uid
        assert (entry["ContainerName"], entry["ResourceName"]) == ("c", FOO)
        assert entry["DeviceIDs"] == {"0": ["d0"], "1": ["d1"]}
        response = pb.ContainerAllocateResponse.FromString(
            checkpoint.decode((state / "kubelet_internal_checkpoint").read_bytes())
            .entries[0]  # type: ignore[index]
            .alloc_resp
            or b""
        )
        assert dict(response.envs) == {"DEV": "d0,d1"}
        assert raw["Data"]["RegisteredDevices"] == {FOO: ["d0", "d1", "d2"]}

        async with Kubelet(plugins, state, grace_period=30) as second:
            assert second.checkpoint_problem is None
            restored = second.pod("held")
            assert restored is not None
            assert restored.containers[0].devices == {FOO: ["d0", "d1"]}
            assert [(e.name, e.value) for e in restored.containers[0].options.envs] == [
                ("DEV", "d0,d1")
            ]
            await second.wait_for_resource(FOO, count=3)
            [greedy] = await second.apply(pod("greedy", {"c": {FOO: 2}}))
            assert greedy.message.endswith("Requested: 2, Available: 1, which is unexpected")
            [small] = await second.apply(pod("small", {"c": {FOO: 1}}))
            assert small.containers[0].devices == {FOO: ["d2"]}


async def test_in_process_restart_reregisters_plugins(tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    async with Kubelet(plugins, tmp_path / "state") as kubelet:
        with PluginProcess(tmp_path, plugins, [plugin(FOO, [device("d0"), device("d1")])]):
            await kubelet.wait_for_resource(FOO, count=2)
            [held] = await kubelet.apply(pod("held", {"c": {FOO: 1}}))
            seen = kubelet.registrations(FOO)
            await kubelet.restart()
            # Until the plugin is back, the resource is known with no devices.
            assert kubelet.resource_status(FOO) is not None
            assert await kubelet.wait_for_registration(FOO, after=seen) == seen + 1
            await kubelet.wait_for_resource(FOO, count=2)
            [other] = await kubelet.apply(pod("other", {"c": {FOO: 1}}))
            assert other.containers[0].devices == {FOO: ["d1"]}
            assert held.containers[0].devices == {FOO: ["d0"]}


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b'{"Data": {"PodDeviceEntries": [', "not valid JSON"),
        (b'{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}},"Checksum":7}', "corrupted"),
    ],
)
async def test_corrupt_checkpoint_is_reported_and_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes, problem: str
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "kubelet_internal_checkpoint").write_bytes(content)
    with caplog.at_level(logging.ERROR, logger="devplug.simulator"):
        async with Kubelet(tmp_path / "plugins", state, control_socket=False) as kubelet:
            assert kubelet.checkpoint_problem is not None
            assert problem in kubelet.checkpoint_problem
            assert kubelet.node_status().checkpoint_problem == kubelet.checkpoint_problem
            assert kubelet.node_status().resources == []
    assert any(
        "failing to read checkpoint" in r.getMessage() and problem in r.getMessage()
        for r in caplog.records
    )


async def test_pod_resources_api(tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    devices = [device("a", [0]), device("b", [1]), device("c"), device("x", [1], healthy=False)]
    async with Kubelet(plugins, tmp_path / "state") as kubelet:
        with PluginProcess(tmp_path, plugins, [plugin(FOO, devices)]):
            await kubelet.wait_for_resource(FOO, count=3)
            [result] = await kubelet.apply(
                pod(
                    "train",
                    {"app": {FOO: 1}},
                    init={"setup": {FOO: 1}, "proxy": {FOO: 1}},
                    sidecars=["proxy"],
                    namespace="ml",
                )
            )
            assert result.admitted, result.message
            async with unix_channel(kubelet.pod_resources_socket) as channel:
                stub = pr_grpc.PodResourcesListerStub(channel)
                listed = await stub.List(pr.ListPodResourcesRequest(), timeout=5)
                [pod_resources] = listed.pod_resources
                assert (pod_resources.name, pod_resources.namespace) == ("train", "ml")

                def devices_of(container: pr.ContainerResources) -> list[tuple[str, list[int]]]:
                    return [
                        (d.device_ids[0], [n.ID for n in d.topology.nodes])
                        for d in container.devices
                        if d.resource_name == FOO
                    ]

                # The sidecar and the app container; not the plain init container. The
                # sidecar took over the init container's device and keeps it.
                proxy, app = pod_resources.containers
                assert (proxy.name, app.name) == ("proxy", "app")
                assert devices_of(proxy) == [("a", [0])]
                assert devices_of(app) == [("b", [1])]

                got = await stub.Get(
                    pr.GetPodResourcesRequest(pod_name="train", pod_namespace="ml"), timeout=5
                )
                assert got.pod_resources == pod_resources

                allocatable = await stub.GetAllocatableResources(
                    pr.AllocatableResourcesRequest(), timeout=5
                )
                assert [
                    (d.resource_name, list(d.device_ids), [n.ID for n in d.topology.nodes])
                    for d in allocatable.devices
                ] == [(FOO, ["a"], [0]), (FOO, ["b"], [1]), (FOO, ["c"], [])]

                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.Get(
                        pr.GetPodResourcesRequest(pod_name="nope", pod_namespace="ml"),
                        timeout=5,
                    )
                assert caught.value.code() == grpc.StatusCode.UNKNOWN
                assert caught.value.details() == "pod nope in namespace ml not found"


async def test_a_failed_start_leaves_nothing_served(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    kubelet = Kubelet(tmp_path / "plugins", tmp_path / "state", control_socket=blocker / "c.sock")

    with pytest.raises(FileExistsError, match="not-a-folder"):
        await kubelet.start()
    assert not kubelet.running
    assert not (tmp_path / "plugins" / "kubelet.sock").exists()
    assert not kubelet.pod_resources_socket.exists()
