"""The simulator's checkpoint against the kubelet's own device manager (dpharness:
pkg/kubelet/cm/devicemanager of v1.36.2): each reads what the other writes."""

from __future__ import annotations

import asyncio
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest
from sim_helpers import cli_command

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.simulator import Kubelet, checkpoint
from devplug.simulator.manager import DeviceManager
from devplug.testing import dpharness

ROOT = Path(__file__).resolve().parents[2]
RESOURCE = "example.com/dev"
CHECKPOINT = "kubelet_internal_checkpoint"

# Four devices of `devplug serve` on NUMA nodes 0, 1, 1 and none, each with its env var
# and annotation: entries with several NUMA keys (-1 among them) and full AllocResps.
CONFIG = textwrap.dedent(
    f"""\
    resources:
      - name: {RESOURCE}
        groups:
          - {{id: dev0, paths: [{{path: /dev/null}}], numaNode: 0,
              env: {{DEV: "0"}}, annotations: {{example.com/dev: zero}}}}
          - {{id: dev1, paths: [{{path: /dev/zero}}], numaNode: 1, env: {{DEV: "1"}}}}
          - {{id: dev2, paths: [{{path: /dev/full}}], numaNode: 1, env: {{DEV: "2"}}}}
          - {{id: dev3, paths: [{{path: /dev/urandom}}], env: {{DEV: "3"}}}}
    """
)


@pytest.fixture(scope="module")
def harness() -> Path:
    binary = dpharness.find(ROOT)
    if binary is None:
        pytest.skip(dpharness.how_to_provide(ROOT))
    return binary


def serve(config: Path) -> Any:
    return lambda folder: cli_command(
        "--log-level", "warning", "serve", "--plugin-dir", str(folder), "--config", str(config)
    )


def write_config(tmp_path: Path) -> Path:
    config = tmp_path / "devices.yaml"
    config.write_text(CONFIG)
    return config


def envs(options: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in options["envs"]}


async def test_a_kubelet_checkpoint_reads_here_byte_for_byte(harness: Path, tmp_path: Path) -> None:
    folder = tmp_path / "kubelet"
    run = dpharness.admit(
        harness, folder, RESOURCE, serve(write_config(tmp_path)), pods=2, count=2, min_capacity=4
    )
    assert run.returncode == 0, run.log[-3000:]
    allocations = [e for _, e in run.allocations]
    assert [e["ok"] for e in allocations] == [True, True]
    blob = (folder / CHECKPOINT).read_bytes()

    # The checksum the kubelet computed is the one computed here, and the file is
    # what encode() writes for what it holds (Go's entry and device orders are random).
    data = checkpoint.decode(blob)
    assert checkpoint.encode(data) == blob
    assert data.entries is not None
    assert len(data.entries) == 2
    writer = checkpoint.CheckpointWriter(tmp_path / CHECKPOINT)
    writer.set_registered({k: list(v or ()) for k, v in (data.registered or {}).items()})
    for entry in data.entries:  # one entry per pod: added at the end, one by one
        writer.put(entry)
    assert writer.encode() == blob

    # The simulator's device manager restores the kubelet's allocations from it.
    manager = DeviceManager(
        folder / CHECKPOINT, grace_period=30, dial_timeout=1, on_event=lambda *a: None
    )

    assert manager.restore([dpharness.pod_uid(0), dpharness.pod_uid(1)]) is None
    await manager.close()
    for index, event in enumerate(allocations):
        held = manager.container_devices(dpharness.pod_uid(index), dpharness.CONTAINER)
        assert sorted(held[RESOURCE].ids()) == sorted(event["devices"])
        assert manager.run_options(dpharness.pod_uid(index), dpharness.CONTAINER).envs[0].value
        response = held[RESOURCE].response
        assert isinstance(response, pb.ContainerAllocateResponse)
        assert dict(response.envs) == envs(event["run_options"])
    assert manager.in_use(RESOURCE) == {d for e in allocations for d in e["devices"]}


@pytest.fixture
async def simulator_checkpoint(
    tmp_path: Path,
) -> tuple[Path, bytes, list[tuple[list[str], dict[str, str]]]]:
    """A config, and the simulator's checkpoint after admitting the harness's pod-0 and
    pod-1 (two devices each) of its plugin, and per pod its devices and env vars."""
    config = write_config(tmp_path)
    plugins, state = tmp_path / "sim-plugins", tmp_path / "sim-state"
    server = await asyncio.create_subprocess_exec(*serve(config)(plugins))
    try:
        async with Kubelet(plugins, state, control_socket=False) as kubelet:
            await kubelet.wait_for_resource(RESOURCE, count=4)
            held = []
            for index in range(2):
                [result] = await kubelet.apply(
                    {
                        "metadata": {"name": f"pod-{index}", "uid": dpharness.pod_uid(index)},
                        "spec": {
                            "containers": [
                                {
                                    "name": dpharness.CONTAINER,
                                    "resources": {"limits": {RESOURCE: 2}},
                                }
                            ]
                        },
                    }
                )
                assert result.admitted, result
                [container] = result.containers
                held.append(
                    (container.devices[RESOURCE], {e.name: e.value for e in container.options.envs})
                )
    finally:
        server.terminate()
        await server.wait()
    return config, (state / CHECKPOINT).read_bytes(), held


def test_the_kubelet_restores_a_simulator_checkpoint(
    harness: Path,
    tmp_path: Path,
    simulator_checkpoint: tuple[Path, bytes, list[tuple[list[str], dict[str, str]]]],
) -> None:
    config, blob, held = simulator_checkpoint
    # NUMA node 1 first (the plugin's preference), then nodes 0 and none (key -1)
    assert [sorted(ids) for ids, _ in held] == [["dev1", "dev2"], ["dev0", "dev3"]]

    # The kubelet reads it at start: pod-0 finds its devices there and gets the runtime
    # options of the stored AllocResp without a new Allocate; pod-1 is not active on
    # this node, so the kubelet frees its devices.
    folder = tmp_path / "kubelet"
    folder.mkdir()
    (folder / CHECKPOINT).write_bytes(blob)
    run = dpharness.admit(
        harness, folder, RESOURCE, serve(config), pods=1, count=2, min_capacity=4, verbosity=4
    )
    assert run.returncode == 0, run.log[-3000:]
    assert "Read data from checkpoint file" in run.log
    assert "failing to read checkpoint" not in run.log
    assert "Found pre-allocated devices for resource on pod" in run.log
    assert "Making allocation request for device plugin" not in run.log
    [(_, event)] = run.allocations
    assert event["ok"], event
    assert sorted(event["devices"]) == sorted(held[0][0])
    assert envs(event["run_options"]) == held[0][1]
    assert held[0][1]["DEV"] == "1,2"
    assert 'podUIDs=["dpharness-pod-1"]' in run.log  # "Pods to be removed"

    # The same file with one byte of the data changed is refused by the kubelet's
    # checksum, and pod-0 is allocated anew.
    shutil.rmtree(folder)
    folder.mkdir()
    (folder / CHECKPOINT).write_bytes(blob.replace(b'"dev3"', b'"dev9"', 1))
    run = dpharness.admit(
        harness, folder, RESOURCE, serve(config), pods=1, count=2, min_capacity=4, verbosity=4
    )
    assert run.returncode == 0, run.log[-3000:]
    assert "checkpoint is corrupted" in run.log
    assert "Making allocation request for device plugin" in run.log
