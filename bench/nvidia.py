"""NVIDIA GPUs with the fake NVML driver: Allocate latency of NVML-backed devices, and
the time from an Xid event to the Unhealthy device in ListAndWatch (and back).

`python bench/nvidia.py` prints its JSON alone; bench/run.py adds it under "nvidia".
"""

from __future__ import annotations

import json
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
    stub_for,
    timed_calls,
    wait_for_health,
)

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.testing.fakenvml import FakeGpuHost, eight_gpus, gpu_uuid

ALLOCATE_CALLS = 2000
XID_ROUNDS = 20
RECOVERY_S = 0.05


def bench_nvidia() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="devplug-bench-gpu-") as tmp:
        root = Path(tmp)
        host = FakeGpuHost(root / "gpus", eight_gpus())
        config = root / "gpus.yaml"
        nvidia = {"hostRoot": host.host_root, "recoverySeconds": RECOVERY_S, "probeSeconds": 1}
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
                    host.inject_xid(round_ % 8, 79)
                    wait_for_health(stream, device, "Unhealthy")
                    down.append(time.perf_counter() - started)
                    started = time.perf_counter()
                    wait_for_health(stream, device, "Healthy")
                    up.append(time.perf_counter() - started)
                stream.cancel()
            rss = rss_mib(proc.pid)
    return {
        "gpus": 8,
        "rss_mib": rss,
        "allocate_1_gpu": percentiles(allocate_one),
        "allocate_2_gpus": percentiles(allocate_two),
        "preferred_4_of_8_nvlink": percentiles(prefer_four),
        "xid_to_unhealthy": percentiles(down),
        "unhealthy_to_healthy_after_quiet_time": percentiles(up) | {"quiet_s": RECOVERY_S},
    }


if __name__ == "__main__":
    print(json.dumps(bench_nvidia(), indent=2))
