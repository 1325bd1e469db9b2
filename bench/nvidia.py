"""NVIDIA GPUs with the fake NVML driver: Allocate latency of whole GPUs (1 and 2), a MIG
device and an MPS replica; the time from an Xid event to the Unhealthy device in
ListAndWatch, back after the quiet time for a transient Xid, and back after a reset for
one that needs it; an MPS daemon's death to its replicas Healthy again; the load of
NVIDIA's plugin config (one file; a folder of named configs); and per-node configs on a
real kube-apiserver: the node label changed to the new config served, and the daemon's
memory with the Kubernetes client of the label watch.

NVIDIA's own plugin (Go, needing a real driver) cannot run here: no side-by-side ratio.
`python bench/nvidia.py` prints its JSON alone; bench/run.py adds it under "nvidia".
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from common import (
    allocate_request,
    daemon,
    percentiles,
    rss_mib,
    serve_command,
    stub_for,
    timed_calls,
    wait_for_health,
)

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.cli.serve import nvidia_config_text
from devplug.config.nvidia import NODE_CONFIG_LABEL as NODE_LABEL
from devplug.config.nvidiaflags import resolve
from devplug.fakes.mps import PID_FILE
from devplug.fakes.mps import script as mps_script
from devplug.fakes.nvml import FakeGpuHost, eight_gpus, gpu_uuid, mig_layout, mig_uuid
from devplug.sources import parse_config

ROOT = Path(__file__).resolve().parent.parent

ALLOCATE_CALLS = 2000
XID_ROUNDS = 20
RESET_ROUNDS = 10
MPS_ROUNDS = 5
CONFIG_LOADS = 200
RECOVERY_S = 0.05
TRANSIENT_XID = 94  # contained ECC error: the application restarts (transient)
RESET_XID = 79  # fallen off the bus: needs a reset

NVIDIA_CONFIG = """\
version: v1
flags:
  migStrategy: none
  plugin: {deviceListStrategy: envvar, deviceIDStrategy: uuid}
sharing:
  timeSlicing:
    renameByDefault: false
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


def bench_nvidia() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="devplug-bench-gpu-") as tmp:
        root = Path(tmp)
        report = whole_gpus(root)
        report |= mig(root)
        report |= mps(root)
        report |= nvidia_config(root)
        report["per_node"] = per_node(root)
    return report


def whole_gpus(root: Path) -> dict[str, Any]:
    host = FakeGpuHost(root / "gpus", eight_gpus())
    config = root / "gpus.yaml"
    nvidia = {"hostRoot": host.host_root, "recoverySeconds": RECOVERY_S, "probeSeconds": 0.05}
    config.write_text(yaml.safe_dump({"resources": [{"nvidia": nvidia}]}))
    plugin_dir = root / "plugins"
    with daemon(config, plugin_dir, env=host.env) as proc:
        channel, stub = stub_for(plugin_dir, "nvidia.com/gpu")
        with channel:
            one = allocate_request([gpu_uuid(0)])
            two = allocate_request([gpu_uuid(0), gpu_uuid(3)])
            timed_calls(lambda: stub.Allocate(one), 200)  # warm-up
            allocate_one = timed_calls(lambda: stub.Allocate(one), ALLOCATE_CALLS)
            allocate_two = timed_calls(lambda: stub.Allocate(two), ALLOCATE_CALLS)
            preferred = pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=[gpu_uuid(i) for i in range(8)],
                        allocation_size=4,
                    )
                ]
            )
            prefer_four = timed_calls(lambda: stub.GetPreferredAllocation(preferred), 500)
            stream = stub.ListAndWatch(pb.Empty())
            next(stream)
            down, up = [], []
            for round_ in range(XID_ROUNDS):
                device = gpu_uuid(round_ % 8)
                started = time.perf_counter()
                host.inject_xid(round_ % 8, TRANSIENT_XID)
                wait_for_health(stream, device, "Unhealthy")
                down.append(time.perf_counter() - started)
                started = time.perf_counter()
                wait_for_health(stream, device, "Healthy")
                up.append(time.perf_counter() - started)
            # An Xid needing a reset: Unhealthy until the GPU was reset (seen as lost and
            # back); here from the GPU answering again to Healthy.
            reset_down, reset_up = [], []
            for round_ in range(RESET_ROUNDS):
                index = round_ % 8
                device = gpu_uuid(index)
                started = time.perf_counter()
                host.inject_xid(index, RESET_XID)
                wait_for_health(stream, device, "Unhealthy")
                reset_down.append(time.perf_counter() - started)
                host.set_lost(index, True)
                time.sleep(0.2)  # the bench's pacing: a probe round sees it lost
                started = time.perf_counter()
                host.set_lost(index, False)
                wait_for_health(stream, device, "Healthy")
                reset_up.append(time.perf_counter() - started)
            stream.cancel()
        rss = rss_mib(proc.pid)
    return {
        "gpus": 8,
        "rss_mib": rss,
        "allocate_1_gpu": percentiles(allocate_one),
        "allocate_2_gpus": percentiles(allocate_two),
        "preferred_4_of_8_nvlink": percentiles(prefer_four),
        "xid_to_unhealthy": percentiles(down) | {"xid": TRANSIENT_XID},
        "unhealthy_to_healthy_after_quiet_time": percentiles(up) | {"quiet_s": RECOVERY_S},
        "reset_xid_to_unhealthy": percentiles(reset_down) | {"xid": RESET_XID},
        "reset_to_healthy": percentiles(reset_up) | {"probe_s": 0.05},
    }


def mig(root: Path) -> dict[str, Any]:
    host = FakeGpuHost(root / "mig", mig_layout())
    config = root / "mig.yaml"
    nvidia = {"hostRoot": host.host_root, "migStrategy": "mixed"}
    config.write_text(yaml.safe_dump({"resources": [{"nvidia": nvidia}]}))
    plugin_dir = root / "mig-plugins"
    with daemon(config, plugin_dir, env=host.env):
        channel, stub = stub_for(plugin_dir, "nvidia.com/mig-3g.20gb")
        with channel:
            request = allocate_request([mig_uuid(1, 2)])
            timed_calls(lambda: stub.Allocate(request), 200)
            samples = timed_calls(lambda: stub.Allocate(request), ALLOCATE_CALLS)
    return {"allocate_1_mig_device": percentiles(samples)}


def mps(root: Path) -> dict[str, Any]:
    """2 GPUs shared 4 ways through the stand-in MPS control daemon."""
    description = eight_gpus()
    description["gpus"] = description["gpus"][:2]
    host = FakeGpuHost(root / "mps-gpus", description)
    mps_root = root / "mps"
    control = mps_script(root / "bin")
    config = root / "mps.yaml"
    nvidia = {
        "hostRoot": host.host_root,
        "sharing": "mps",
        "replicas": 4,
        "mps": {"root": str(mps_root), "control": str(control), "checkSeconds": 0.1},
    }
    config.write_text(yaml.safe_dump({"resources": [{"nvidia": nvidia}]}))
    plugin_dir = root / "mps-plugins"
    started = time.perf_counter()
    with daemon(config, plugin_dir, env=host.env):
        channel, stub = stub_for(plugin_dir, "nvidia.com/gpu")
        with channel:
            stream = stub.ListAndWatch(pb.Empty())
            replica = f"{gpu_uuid(1)}::0"
            wait_for_health(stream, replica, "Healthy")
            ready = time.perf_counter() - started
            request = allocate_request([f"{gpu_uuid(0)}::0"])
            timed_calls(lambda: stub.Allocate(request), 200)
            samples = timed_calls(lambda: stub.Allocate(request), ALLOCATE_CALLS)
            restarts = []
            pid_file = mps_root / "nvidia.com" / "gpu" / "pipe" / PID_FILE
            for _ in range(MPS_ROUNDS):
                began = time.perf_counter()
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
                wait_for_health(stream, replica, "Unhealthy")
                wait_for_health(stream, replica, "Healthy")
                restarts.append(time.perf_counter() - began)
            stream.cancel()
    return {
        "mps_gpus": 2,
        "mps_ready_from_start_s": round(ready, 3),
        "allocate_1_mps_replica": percentiles(samples),
        "mps_daemon_killed_to_healthy": percentiles(restarts) | {"check_s": 0.1},
    }


def nvidia_config(root: Path) -> dict[str, Any]:
    """parse_config of an `nvidia:` entry naming NVIDIA's config: one file, and a folder
    of 20 named configs (each checked, one chosen)."""
    one = root / "nvidia-config.yaml"
    one.write_text(NVIDIA_CONFIG)
    folder = root / "available-configs"
    folder.mkdir()
    for i in range(20):
        (folder / f"config-{i}").write_text(
            NVIDIA_CONFIG.replace("replicas: 4", f"replicas: {i + 2}")
        )
    file_text = yaml.safe_dump({"resources": [{"nvidia": {"nvidiaConfig": {"file": str(one)}}}]})
    folder_text = yaml.safe_dump(
        {
            "resources": [
                {"nvidia": {"nvidiaConfig": {"folder": str(folder), "default": "config-3"}}}
            ]
        }
    )
    parse_config(file_text)  # warm-up: imports
    file_samples = timed_calls(lambda: parse_config(file_text), CONFIG_LOADS)
    folder_samples = timed_calls(lambda: parse_config(folder_text), CONFIG_LOADS // 4)
    # NVIDIA's chart: its environment resolved over the file (`nvidia-device-plugin`).
    environ = {
        "MPS_ROOT": "/run/nvidia/mps",
        "MIG_STRATEGY": "mixed",
        "PASS_DEVICE_SPECS": "true",
        "DEVICE_LIST_STRATEGY": "envvar",
        "CONFIG_FILE": str(one),
    }

    def chart_env() -> None:
        resolved = resolve([], environ)
        parse_config(nvidia_config_text(resolved.config_file, resolved.overrides))

    chart_env()
    env_samples = timed_calls(chart_env, CONFIG_LOADS)
    return {
        "load_nvidia_config_file": percentiles(file_samples),
        "load_nvidia_config_folder_20": percentiles(folder_samples),
        "nvidia_chart_env_over_file": percentiles(env_samples),
    }


LABEL_ROUNDS = 5
GPU = "nvidia.com/gpu"
NODE = "bench-gpu-node"


def per_node(root: Path) -> dict[str, Any]:
    """`devplug serve` on a folder of named configs (8 GPUs, fake NVML) with its node on
    a real kube-apiserver: the label set to 'sliced' (4 replicas each) and removed again,
    from the API call to the kubelet (simulator) listing the GPUs as that config says."""
    from devplug.testing.controlplane import ControlPlane, how_to_provide

    plane = ControlPlane.find(ROOT)
    if plane is None:
        return {"skipped": how_to_provide(ROOT)}
    kubeconfig = plane.start()
    try:
        return _label_changes(root / "per-node", kubeconfig)
    finally:
        plane.stop()


def _label_changes(root: Path, kubeconfig: str) -> dict[str, Any]:
    from kubernetes import client

    from devplug.testing.official import api_client

    api = api_client(kubeconfig)
    core: Any = client.CoreV1Api(api)
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    try:
        return asyncio.run(_follow_the_label(root, kubeconfig, core))
    finally:
        core.delete_node(NODE)
        api.close()


async def _follow_the_label(root: Path, kubeconfig: str, core: Any) -> dict[str, Any]:
    from devplug.simulator import Kubelet

    host = FakeGpuHost(root / "gpus", eight_gpus())
    folder = root / "available-configs"
    folder.mkdir(parents=True)
    (folder / "default").write_text("version: v1\n")
    (folder / "sliced").write_text(NVIDIA_CONFIG)
    config = root / "per-node.yaml"
    block = {"hostRoot": host.host_root, "nvidiaConfig": {"folder": str(folder)}}
    config.write_text(yaml.safe_dump({"resources": [{"nvidia": block}]}))
    plugin_dir = root / "plugins"
    flags = ("--node-name", NODE, "--kubeconfig", kubeconfig)
    proc = await asyncio.create_subprocess_exec(
        *serve_command(config, plugin_dir, *flags), env={**os.environ, **host.env}
    )
    try:
        async with Kubelet(plugin_dir, root / "kubelet", control_socket=False) as kubelet:
            await kubelet.wait_for_resource(GPU, count=8, timeout=30)
            rss = rss_mib(proc.pid)
            samples = []
            for _ in range(LABEL_ROUNDS):
                for value, count in (("sliced", 32), (None, 8)):
                    started = time.perf_counter()
                    labels = {"metadata": {"labels": {NODE_LABEL: value}}}
                    await asyncio.to_thread(core.patch_node, NODE, labels)
                    await kubelet.wait_for_resource(GPU, count=count, timeout=30)
                    samples.append(time.perf_counter() - started)
    finally:
        proc.send_signal(signal.SIGTERM)
        await proc.wait()
    return {"rss_with_label_watch_mib": rss, "label_changed_to_served": percentiles(samples)}


if __name__ == "__main__":
    print(json.dumps(bench_nvidia(), indent=2))
