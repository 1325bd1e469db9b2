"""A Daemon serving plugins in-process, exercised through a real gRPC client on its socket."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest

from devplug import AllocationError, ContainerEdits, Daemon, Device, DeviceNode, Mount, Plugin
from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.framework import observe
from devplug.framework.servicer import edits_to_wire
from devplug.ground.channel import unix_channel
from tests.serve_helpers import serving

TIMEOUT = 10


def gpu(i: int, numa: int, healthy: bool = True) -> Device:
    return Device(
        f"gpu{i}",
        healthy=healthy,
        numa_nodes=[numa],
        nodes=[DeviceNode(f"/dev/gpu{i}"), DeviceNode("/dev/gpuctl", permissions="r")],
        mounts=[Mount("/usr/lib/gpu", "/usr/local/gpu", read_only=True)],
        env={"GPU_VISIBLE": str(i)},
        annotations={"gpu.example.com/model": "x1"},
        cdi_devices=[f"example.com/gpu=gpu{i}"],
    )


class Gpus(Plugin):
    resource_name = "example.com/gpu"
    ids_env = "GPU_IDS"
    preferred_allocation = True


def gpus() -> Gpus:
    return Gpus(devices=[gpu(0, 0), gpu(1, 0), gpu(2, 1), gpu(3, 1, healthy=False)])


async def expect_error(call: object, code: grpc.StatusCode, *fragments: str) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    assert info.value.code() == code, info.value.details()
    details = info.value.details() or ""
    for fragment in fragments:
        assert fragment in details
    return details


async def test_options_and_socket_mode(tmp_path: Path) -> None:
    async with serving(tmp_path, gpus(), Plugin("example.com/plain", devices=[])) as stubs:
        options = await stubs["example.com/gpu"].GetDevicePluginOptions(pb.Empty())
        assert options.get_preferred_allocation_available
        assert not options.pre_start_required
        plain = await stubs["example.com/plain"].GetDevicePluginOptions(pb.Empty())
        assert not plain.get_preferred_allocation_available
        for name in ("devplug-example.com-gpu.sock", "devplug-example.com-plain.sock"):
            mode = (tmp_path / name).stat().st_mode
            assert stat.S_ISSOCK(mode)
            assert stat.S_IMODE(mode) == 0o600
    assert not (tmp_path / "devplug-example.com-gpu.sock").exists()


async def test_allocate_merges_device_edits(tmp_path: Path) -> None:
    async with serving(tmp_path, gpus()) as stubs:
        request = pb.AllocateRequest(
            container_requests=[
                pb.ContainerAllocateRequest(devices_ids=["gpu0", "gpu2"]),
                pb.ContainerAllocateRequest(devices_ids=[]),
                pb.ContainerAllocateRequest(devices_ids=["gpu1"]),
            ]
        )
        response = await stubs["example.com/gpu"].Allocate(request)
        first, empty, third = response.container_responses
        assert [(d.host_path, d.container_path, d.permissions) for d in first.devices] == [
            ("/dev/gpu0", "/dev/gpu0", "rw"),
            ("/dev/gpuctl", "/dev/gpuctl", "r"),
            ("/dev/gpu2", "/dev/gpu2", "rw"),
        ]
        assert [(m.host_path, m.container_path, m.read_only) for m in first.mounts] == [
            ("/usr/lib/gpu", "/usr/local/gpu", True)
        ]
        assert dict(first.envs) == {"GPU_VISIBLE": "0,2", "GPU_IDS": "gpu0,gpu2"}
        assert dict(first.annotations) == {"gpu.example.com/model": "x1"}
        assert [c.name for c in first.cdi_devices] == [
            "example.com/gpu=gpu0",
            "example.com/gpu=gpu2",
        ]
        assert empty == pb.ContainerAllocateResponse()
        assert dict(third.envs)["GPU_IDS"] == "gpu1"


async def test_the_served_default_answer_is_what_plugin_allocate_returns(tmp_path: Path) -> None:
    # The servicer writes the default hook's answer straight into the response; a
    # subclass calling super().allocate() must get the very same edits.
    cards = gpus()
    virtual = Gpus(resource_name="example.com/virtual", devices=[Device("v0"), Device("v1")])
    async with serving(tmp_path, cards, virtual) as stubs:
        for plugin, ids in ((cards, ["gpu0", "gpu2"]), (cards, ["gpu1"]), (virtual, ["v1", "v0"])):
            request = pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]
            )
            response = await stubs[plugin.resource_name].Allocate(request)
            wanted = edits_to_wire(await plugin.allocate([plugin.devices[i] for i in ids]))
            assert list(response.container_responses) == [wanted], ids


async def test_allocate_bad_inputs_keep_the_daemon_serving(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def req(*ids: str) -> pb.AllocateRequest:
        return pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])

    with caplog.at_level("WARNING", logger="devplug.plugin"):
        async with serving(tmp_path, gpus()) as stubs:
            stub = stubs["example.com/gpu"]
            unknown = ("nope", "gpu9")
            await expect_error(
                stub.Allocate(req("gpu0", *unknown)), grpc.StatusCode.INVALID_ARGUMENT, *unknown
            )
            await expect_error(
                stub.Allocate(req("gpu0", "gpu1", "gpu0")),
                grpc.StatusCode.INVALID_ARGUMENT,
                "more than once",
                "gpu0",
            )
            await expect_error(
                stub.Allocate(req("gpu3")), grpc.StatusCode.FAILED_PRECONDITION, "unhealthy", "gpu3"
            )
            many = tuple(f"x{i}" for i in range(10_000))
            details = await expect_error(
                stub.Allocate(req(*many), timeout=TIMEOUT), grpc.StatusCode.INVALID_ARGUMENT
            )
            assert "and 9990 more" in details
            ok = await stub.Allocate(req("gpu1"))  # still serving
            assert dict(ok.container_responses[0].envs)["GPU_IDS"] == "gpu1"
    refusals = [r for r in caplog.records if "Allocate refused" in r.getMessage()]
    assert len(refusals) == 4  # each error logged once, with the resource
    assert all(getattr(r, "resource", None) == "example.com/gpu" for r in refusals)


async def test_allocate_of_ten_thousand_devices(tmp_path: Path) -> None:
    devices = [Device(f"d{i}") for i in range(10_000)]

    plugin = Plugin("example.com/many", devices=devices)
    plugin.ids_env = "IDS"
    async with serving(tmp_path, plugin) as stubs:
        ids = [d.id for d in devices]
        response = await stubs["example.com/many"].Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]),
            timeout=TIMEOUT,
        )
        assert response.container_responses[0].envs["IDS"].split(",") == ids


async def test_the_default_hook_with_an_ids_variable_no_runtime_takes_is_refused(
    tmp_path: Path,
) -> None:
    """The framework's own hook is trusted to build what a runtime takes, except for the
    IDs' variable a plugin names: a name with '=' is refused, never sent."""
    plugin = Plugin("example.com/named", devices=[Device("d0")])
    plugin.ids_env = "IDS=ALL"
    async with serving(tmp_path, plugin) as stubs:
        await expect_error(
            stubs["example.com/named"].Allocate(
                pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=["d0"])]
                ),
                timeout=TIMEOUT,
            ),
            grpc.StatusCode.INTERNAL,
            "Plugin.allocate",
            "'IDS=ALL'",
        )


async def test_list_and_watch_streams_full_lists(tmp_path: Path) -> None:
    plugin = gpus()
    async with serving(tmp_path, plugin) as stubs:
        streams = [stubs["example.com/gpu"].ListAndWatch(pb.Empty()) for _ in range(3)]
        for stream in streams:
            first = await stream.read()
            assert [(d.ID, d.health) for d in first.devices] == [
                ("gpu0", "Healthy"),
                ("gpu1", "Healthy"),
                ("gpu2", "Healthy"),
                ("gpu3", "Unhealthy"),
            ]
            assert [n.ID for n in first.devices[2].topology.nodes] == [1]
        plugin.set_health("gpu3", True)
        for stream in streams:
            update = await stream.read()
            assert all(d.health == "Healthy" for d in update.devices)
            assert len(update.devices) == 4  # the whole list, not a delta
        plugin.publish([gpu(0, 0)])
        for stream in streams:
            update = await stream.read()
            assert [d.ID for d in update.devices] == ["gpu0"]
        plugin.publish([gpu(0, 0)])  # no change: nothing sent
        plugin.publish([gpu(0, 0), gpu(5, 1)])
        for stream in streams:
            update = await stream.read()
            assert [d.ID for d in update.devices] == ["gpu0", "gpu5"]
        # Shutdown ends every stream with OK, not an error.
        await stubs.shutdown()
        for stream in streams:
            assert await stream.read() is grpc.aio.EOF
            assert await stream.code() == grpc.StatusCode.OK


async def test_preferred_allocation(tmp_path: Path) -> None:
    def req(avail: Sequence[str], must: Sequence[str], size: int) -> pb.PreferredAllocationRequest:
        return pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=avail, must_include_deviceIDs=must, allocation_size=size
                )
            ]
        )

    devices = [gpu(0, 0), gpu(1, 1), gpu(2, 0), gpu(3, 1), gpu(4, 1)]
    async with serving(tmp_path, Gpus(devices=devices)) as stubs:
        stub = stubs["example.com/gpu"]
        all_ids = [d.id for d in devices]
        answer = await stub.GetPreferredAllocation(req(all_ids, [], 2))
        assert list(answer.container_responses[0].deviceIDs) == ["gpu0", "gpu2"]
        answer = await stub.GetPreferredAllocation(req(all_ids, ["gpu1"], 3))
        assert list(answer.container_responses[0].deviceIDs) == ["gpu1", "gpu3", "gpu4"]
        answer = await stub.GetPreferredAllocation(req(["gpu0", "gpu3", "gone"], [], 2))
        assert sorted(answer.container_responses[0].deviceIDs) == ["gpu0", "gpu3"]
        await expect_error(
            stub.GetPreferredAllocation(req(["gpu0"], [], 2)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "exceeds",
        )
        await expect_error(
            stub.GetPreferredAllocation(req(["gpu0"], ["gpu1"], 1)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "gpu1",
        )
        await expect_error(
            stub.GetPreferredAllocation(req(all_ids, ["gpu0", "gpu1"], 1)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "smaller",
        )


class Checked(Plugin):
    """Custom hooks: a refusing allocate, a failing one, and a pre-start."""

    resource_name = "example.com/checked"
    started: list[list[str]]

    async def allocate(self, devices: Sequence[Device]) -> ContainerEdits:
        if any(d.id == "locked" for d in devices):
            raise AllocationError("locked is reserved", grpc.StatusCode.PERMISSION_DENIED)
        if any(d.id == "broken" for d in devices):
            raise RuntimeError("firmware did not answer")
        edits = await super().allocate(devices)
        edits.env["CUSTOM"] = "yes"
        return edits

    async def pre_start(self, devices: Sequence[Device]) -> None:
        if any(d.id == "broken" for d in devices):
            raise RuntimeError("reset timed out")
        self.started.append([d.id for d in devices])


async def test_custom_hooks(tmp_path: Path) -> None:
    plugin = Checked(devices=[Device("ok"), Device("locked"), Device("broken")])
    plugin.started = []
    async with serving(tmp_path, plugin) as stubs:
        stub = stubs["example.com/checked"]
        options = await stub.GetDevicePluginOptions(pb.Empty())
        assert options.pre_start_required
        assert not options.get_preferred_allocation_available

        def req(i: str) -> pb.AllocateRequest:
            return pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=[i])]
            )

        ok = await stub.Allocate(req("ok"))
        assert ok.container_responses[0].envs["CUSTOM"] == "yes"
        await expect_error(stub.Allocate(req("locked")), grpc.StatusCode.PERMISSION_DENIED)
        await expect_error(stub.Allocate(req("broken")), grpc.StatusCode.INTERNAL, "firmware")
        await stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=["ok"]))
        assert plugin.started == [["ok"]]
        refused: list[observe.Event] = []
        observe.add_observer(refused.append)
        try:
            await expect_error(
                stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=["broken"])),
                grpc.StatusCode.INTERNAL,
                "pre-start failed: reset timed out",
            )
        finally:
            observe.remove_observer(refused.append)
        # Counted with the other refusals (the metrics' refused requests by code).
        assert [(e.kind, e.fields.get("method"), e.fields.get("code")) for e in refused] == [
            (observe.REFUSED, "PreStartContainer", "INTERNAL")
        ]
        await expect_error(
            stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=["zzz"])),
            grpc.StatusCode.INVALID_ARGUMENT,
            "zzz",
        )
        await expect_error(
            stub.GetPreferredAllocation(pb.PreferredAllocationRequest()),
            grpc.StatusCode.UNIMPLEMENTED,
        )


async def test_socket_is_served_only_after_the_first_publish(tmp_path: Path) -> None:
    class Slow(Plugin):
        resource_name = "example.com/slow"

        def __init__(self) -> None:
            super().__init__()
            self.go = asyncio.Event()

        async def scan(self) -> None:
            await self.go.wait()
            self.publish([Device("s0")])
            await asyncio.Event().wait()  # keeps watching

    plugin = Slow()
    quick = Plugin("example.com/quick", devices=[Device("q0")])
    stop = asyncio.Event()
    task = asyncio.create_task(Daemon([plugin, quick], tmp_path).run(stop))
    socket = tmp_path / plugin.socket_name
    # The daemon is up and serving what it knows (the quick plugin)...
    async with unix_channel(tmp_path / quick.socket_name) as channel:
        await pb_grpc.DevicePluginStub(channel).GetDevicePluginOptions(
            pb.Empty(), wait_for_ready=True, timeout=TIMEOUT
        )
    # ...but not the plugin whose devices are unknown yet.
    assert not socket.exists()
    plugin.go.set()
    async with unix_channel(socket) as channel:
        stream = pb_grpc.DevicePluginStub(channel).ListAndWatch(
            pb.Empty(), wait_for_ready=True, timeout=TIMEOUT
        )
        first = await stream.read()
        assert [d.ID for d in first.devices] == ["s0"]
        stream.cancel()
    stop.set()
    await asyncio.wait_for(task, TIMEOUT)


async def test_failing_scan_stops_the_daemon(tmp_path: Path) -> None:
    class Broken(Plugin):
        resource_name = "example.com/broken"

        async def scan(self) -> None:
            raise OSError("no such bus")

    with pytest.raises(OSError, match="no such bus"):
        await asyncio.wait_for(Daemon([Broken()], tmp_path).run(asyncio.Event()), TIMEOUT)


def test_duplicate_resources_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="served twice"):
        Daemon([Plugin("example.com/a", devices=[]), Plugin("example.com/a", devices=[])], tmp_path)
    with pytest.raises(ValueError, match="resource name"):
        Plugin("gpu", devices=[])


def test_socket_path_too_long_is_a_clear_error(tmp_path: Path) -> None:
    deep = tmp_path / ("x" * 100)
    with pytest.raises(ValueError, match="longer than 107 bytes"):
        Daemon([Plugin("example.com/a", devices=[])], deep)


async def test_services_run_beside_the_plugins_and_stop_with_the_daemon(tmp_path: Path) -> None:
    class Recorder:
        def __init__(self) -> None:
            self.saw: list[str] = []
            self.started = asyncio.Event()
            self.cancelled = False

        async def run(self, daemon: Daemon) -> None:
            self.saw = [p.resource_name for p in daemon.plugins]
            self.started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise

    recorder = Recorder()
    stop = asyncio.Event()
    task = asyncio.create_task(Daemon([gpus()], tmp_path, services=[recorder]).run(stop))
    await asyncio.wait_for(recorder.started.wait(), TIMEOUT)
    assert recorder.saw == ["example.com/gpu"]
    stop.set()
    await asyncio.wait_for(task, TIMEOUT)
    assert recorder.cancelled


async def test_failing_service_stops_the_daemon(tmp_path: Path) -> None:
    class Broken:
        async def run(self, daemon: Daemon) -> None:
            raise OSError("cannot write the feature file")

    with pytest.raises(OSError, match="feature file"):
        await asyncio.wait_for(
            Daemon([gpus()], tmp_path, services=[Broken()]).run(asyncio.Event()), TIMEOUT
        )
