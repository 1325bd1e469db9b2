"""Host device plugins on real device nodes: health by existence, new glob matches,
allocation content, and a removed node reported Unhealthy on the wire (how fast: the
benchmark's `health` section)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.framework.device import Device
from devplug.sources import HostDevicePlugin, build_plugins, parse_config
from tests.serve_helpers import serving

TIMEOUT_S = 5.0  # for events that come in milliseconds; only a failure waits this long


def mknod(path: Path) -> None:
    """A real character device node, like /dev/null."""
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))


def host_plugin(yaml_text: str) -> HostDevicePlugin:
    [plugin] = build_plugins(parse_config(yaml_text))
    assert isinstance(plugin, HostDevicePlugin)
    return plugin


def resource(groups: str, extra: str = "") -> str:
    """A host resource 'example.com/node' with these `groups` (YAML lines)."""
    head = "resources:\n  - name: example.com/node\n    allowAnyPath: true\n"
    return f"{head}{extra}    groups:\n{groups}"


def by_path(plugin: HostDevicePlugin) -> dict[str, Device]:
    """The published devices by the host path of their first node."""
    return {d.nodes[0].host_path: d for d in plugin.devices.values()}


@contextlib.asynccontextmanager
async def scanning(plugin: HostDevicePlugin) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(plugin.scan())
    published = asyncio.create_task(plugin.wait_published())
    try:
        async with asyncio.timeout(TIMEOUT_S):
            await asyncio.wait({task, published}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()
            pytest.fail("scan() returned")
        yield task
        assert not task.done(), "scan() stopped"
    finally:
        published.cancel()
        task.cancel()
        await asyncio.gather(task, published, return_exceptions=True)


async def until(plugin: HostDevicePlugin, condition: Callable[[], bool]) -> None:
    """Wait, on the plugin's change events, until `condition()` holds."""
    generation = plugin.generation
    async with asyncio.timeout(TIMEOUT_S):
        while not condition():
            generation = await plugin.wait_changed(generation)


async def test_removed_node_turns_unhealthy_and_back(tmp_path: Path) -> None:
    for name in ("dev0", "dev1"):
        mknod(tmp_path / name)
    plugin = host_plugin(
        resource(
            f"      - paths: [{{path: {tmp_path}/dev0}}]\n"
            f"      - paths: [{{path: {tmp_path}/dev1}}]\n"
        )
    )
    node0, node1 = str(tmp_path / "dev0"), str(tmp_path / "dev1")

    async with scanning(plugin):
        assert [d.healthy for d in by_path(plugin).values()] == [True, True]
        os.unlink(node0)
        await until(plugin, lambda: not by_path(plugin)[node0].healthy)
        # It stays in the list, the other device is untouched.
        assert list(by_path(plugin)) == [node0, node1]
        assert by_path(plugin)[node1].healthy
        mknod(Path(node0))
        await until(plugin, lambda: by_path(plugin)[node0].healthy)


async def test_glob_matches_come_and_stay(tmp_path: Path) -> None:
    mknod(tmp_path / "acc0")
    plugin = host_plugin(resource(f"      - paths: [{{path: '{tmp_path}/acc*'}}]\n"))
    acc0, acc1 = str(tmp_path / "acc0"), str(tmp_path / "acc1")

    async with scanning(plugin):
        assert list(by_path(plugin)) == [acc0]
        mknod(Path(acc1))
        await until(plugin, lambda: acc1 in by_path(plugin))
        assert by_path(plugin)[acc1].healthy
        ids = list(plugin.devices)
        # A match that disappears stays, Unhealthy; one that comes back is healthy.
        os.unlink(acc0)
        await until(plugin, lambda: not by_path(plugin)[acc0].healthy)
        assert list(plugin.devices) == ids
        os.unlink(acc1)
        await until(plugin, lambda: not by_path(plugin)[acc1].healthy)
        mknod(Path(acc1))
        await until(plugin, lambda: by_path(plugin)[acc1].healthy)
        assert not by_path(plugin)[acc0].healthy
        # A file that does not match is no device.
        (tmp_path / "other").touch()
        mknod(tmp_path / "acc2")
        await until(plugin, lambda: str(tmp_path / "acc2") in by_path(plugin))
        assert str(tmp_path / "other") not in by_path(plugin)


async def test_folders_that_come_later(tmp_path: Path) -> None:
    """A path in a missing folder is Unhealthy until the folder and node appear; a glob
    over intermediate folders finds nodes in folders created after the start."""
    static = tmp_path / "card" / "sub" / "ctl"
    plugin = host_plugin(
        resource(
            f"      - paths: [{{path: {static}}}]\n"
            f"      - paths: [{{path: '{tmp_path}/bus/*/dev*'}}]\n",
        )
    )

    async with scanning(plugin):
        assert [(p, d.healthy) for p, d in by_path(plugin).items()] == [(str(static), False)]
        assert any("matches nothing" in w for w in plugin.warnings)
        static.parent.mkdir(parents=True)
        mknod(static)
        await until(plugin, lambda: by_path(plugin)[str(static)].healthy)
        usb = tmp_path / "bus" / "001"
        usb.mkdir(parents=True)
        mknod(usb / "dev2")
        await until(plugin, lambda: str(usb / "dev2") in by_path(plugin))
        (tmp_path / "bus" / "002").mkdir()
        mknod(tmp_path / "bus" / "002" / "dev1")
        await until(plugin, lambda: str(tmp_path / "bus/002/dev1") in by_path(plugin))
        assert plugin.warnings == []
        # The whole folder goes: its devices stay, Unhealthy; it comes back: healthy.
        shutil.rmtree(tmp_path / "bus")
        await until(plugin, lambda: sum(d.healthy for d in plugin.devices.values()) == 1)
        usb.mkdir(parents=True)
        mknod(usb / "dev2")
        await until(plugin, lambda: by_path(plugin)[str(usb / "dev2")].healthy)
        assert not by_path(plugin)[str(tmp_path / "bus/002/dev1")].healthy


async def test_allocate_gives_nodes_mounts_env_and_ids(tmp_path: Path) -> None:
    for name in ("gpu0", "gpu1", "ctl"):
        mknod(tmp_path / name)
    lib = tmp_path / "lib"
    lib.mkdir()
    plugin = host_plugin(
        resource(
            f"""      - paths:
          - path: '{tmp_path}/gpu*'
          - {{path: {tmp_path}/ctl, permissions: r, containerPath: /dev/ctl}}
        mounts: [{{hostPath: {lib}, containerPath: /usr/lib/gpu, readOnly: true}}]
        env: {{GPU_MODE: shared}}
        annotations: {{example.com/gpu: "yes"}}
        cdiDevices: [example.com/gpu=all]
        numaNode: 1
""",
            extra="    count: 2\n",
        )
    )

    async with scanning(plugin):
        devices = list(plugin.devices.values())
        assert len(devices) == 4  # 2 matches x 2 replicas
        assert all(d.id.endswith(("::0", "::1")) for d in devices)
        assert all(d.numa_nodes == (1,) for d in devices)
        # Two replicas of gpu0 and one of gpu1.
        chosen = [devices[0], devices[1], devices[2]]
        edits = await plugin.allocate(chosen)
        nodes = [(n.host_path, n.container_path, n.permissions) for n in edits.nodes]
        assert nodes == [
            (str(tmp_path / "gpu0"), str(tmp_path / "gpu0"), "rw"),
            (str(tmp_path / "ctl"), "/dev/ctl", "r"),
            (str(tmp_path / "gpu1"), str(tmp_path / "gpu1"), "rw"),
        ]
        assert [(m.host_path, m.container_path, m.read_only) for m in edits.mounts] == [
            (str(lib), "/usr/lib/gpu", True)
        ]
        assert edits.env["GPU_MODE"] == "shared"
        assert edits.env["DEVPLUG_EXAMPLE_COM_NODE"] == ",".join(d.id for d in chosen)
        assert edits.annotations == {"example.com/gpu": "yes"}
        assert edits.cdi_devices == ["example.com/gpu=all"]


async def test_list_and_watch_reports_a_removed_node_unhealthy(tmp_path: Path) -> None:
    mknod(tmp_path / "dev0")
    plugin = host_plugin(resource(f"      - paths: [{{path: '{tmp_path}/dev*'}}]\n"))
    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()

    async with serving(plugin_dir, plugin) as stubs:
        stream = stubs[plugin.resource_name].ListAndWatch(pb.Empty())
        async with asyncio.timeout(TIMEOUT_S):
            first = await stream.read()
        assert isinstance(first, pb.ListAndWatchResponse)
        assert [d.health for d in first.devices] == ["Healthy"]
        os.unlink(tmp_path / "dev0")
        async with asyncio.timeout(TIMEOUT_S):
            while True:
                response = await stream.read()
                assert isinstance(response, pb.ListAndWatchResponse)
                if [d.health for d in response.devices] == ["Unhealthy"]:
                    break
        stream.cancel()


async def test_optional_nodes_and_required_mounts_follow_the_host(tmp_path: Path) -> None:
    """An optional node joins the device when it comes and leaves when it goes; a
    required mount makes its device Unhealthy while it is missing; an optional mount is
    left out while missing."""
    mknod(tmp_path / "main")
    plugin = host_plugin(
        resource(
            f"      - id: main\n"
            f"        paths:\n"
            f"          - {{path: {tmp_path}/main}}\n"
            f"          - {{path: {tmp_path}/extra, optional: true}}\n"
            f"      - id: data\n"
            f"        mounts:\n"
            f"          - {{hostPath: {tmp_path}/data, containerPath: /data, required: true}}\n"
            f"          - {{hostPath: {tmp_path}/opt, optional: true}}\n"
        )
    )
    main, extra = str(tmp_path / "main"), str(tmp_path / "extra")

    def device(device_id: str) -> Device:
        return plugin.devices[device_id]

    async with scanning(plugin):
        assert [n.host_path for n in device("main").nodes] == [main]
        assert not device("data").healthy
        mknod(Path(extra))
        await until(plugin, lambda: len(device("main").nodes) == 2)
        assert [n.host_path for n in device("main").nodes] == [main, extra]
        os.unlink(extra)
        await until(plugin, lambda: len(device("main").nodes) == 1)
        assert device("main").healthy
        (tmp_path / "data").mkdir()
        await until(plugin, lambda: device("data").healthy)
        assert [m.container_path for m in device("data").mounts] == ["/data"]
        (tmp_path / "opt").mkdir()
        await until(plugin, lambda: len(device("data").mounts) == 2)
