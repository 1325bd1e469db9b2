"""A short check on a host with an NVIDIA GPU: `devplug serve` with `nvidia: {}` against
the kubelet simulator, printing the GPUs discovered, an admitted pod's env and device
nodes (which must exist on the host), the node labels file and the Allocate latency.

    tools/gpu-check.sh            # the real driver
    tools/gpu-check.sh --fake     # the fake NVML (8 GPUs), to try the check anywhere
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import grpc
import yaml

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.testing import KubeletHarness

GPU = "nvidia.com/gpu"
ALLOCATE_CALLS = 200


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake", action="store_true", help="use the fake NVML (8 GPUs)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        root = Path(tmp)
        nvidia: dict[str, object] = {}
        env: dict[str, str] = {}
        if args.fake:
            from devplug.testing.fakenvml import FakeGpuHost, eight_gpus

            host = FakeGpuHost(root / "fake", eight_gpus())
            nvidia["hostRoot"] = host.host_root
            env = host.env
        features = root / "features.d" / "devplug"
        config = {"nodeFeatures": {"path": str(features)}, "resources": [{"nvidia": nvidia}]}
        with KubeletHarness(timeout=30) as kubelet:
            serve = kubelet.start_serve(yaml.safe_dump(config), env=env)
            status = kubelet.wait_for_resource(GPU)
            print(f"== discovery: {status.capacity} device(s), {status.allocatable} allocatable")
            for device in kubelet.devices(GPU):
                health = "Healthy" if device.healthy else "Unhealthy"
                print(f"  {device.id}  {health}  numa {device.numa_nodes or '-'}")
            print("== daemon log")
            print(serve.output.rstrip())
            if not status.allocatable:
                print("no GPU to allocate: stopping here")
                return 1
            pod = kubelet.admit({GPU: 1})
            print(f"== pod {pod.name}: {'admitted' if pod.admitted else pod.message}")
            if not pod.admitted:
                return 1
            for name, value in sorted(pod.env().items()):
                print(f"  env {name}={value}")
            missing = 0
            for container_path, host_path in sorted(pod.device_nodes().items()):
                host_file = host_path
                if args.fake:
                    host_file = str(nvidia["hostRoot"]) + host_path
                exists = os.path.exists(host_file)
                missing += not exists
                state = "exists" if exists else "MISSING"
                print(f"  device {container_path} <- {host_path} ({state})")
            kubelet.wait_until(features.exists, what="the labels file")
            print(f"== labels file {features}")
            print(features.read_text().rstrip())
            [uuid] = pod.devices()[GPU]
            print(f"== Allocate latency ({ALLOCATE_CALLS} calls of 1 GPU)")
            print("  " + allocate_latency(kubelet.plugin_dir, uuid))
            return 1 if missing else 0


def allocate_latency(plugin_dir: Path, uuid: str) -> str:
    socket = plugin_dir / ("devplug-" + GPU.replace("/", "-") + ".sock")
    request = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=[uuid])]
    )
    samples = []
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = pb_grpc.DevicePluginStub(channel)
        stub.Allocate(request, wait_for_ready=True, timeout=10)
        for _ in range(ALLOCATE_CALLS):
            started = time.perf_counter()
            stub.Allocate(request, timeout=10)
            samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return (
        f"p50 {samples[len(samples) // 2]:.3f} ms, p99 {samples[int(len(samples) * 0.99)]:.3f} ms, "
        f"max {samples[-1]:.3f} ms"
    )


if __name__ == "__main__":
    sys.exit(main())
