"""DRA against a real control plane: daemon start until its ResourceSlice is
published, NodePrepareResources latency (claims read from the API server, a CDI spec
written per claim; then the same claims again, answered from the checkpoint), and a
hot-plugged device node until the slice lists it.

Skipped (with the reason) where the control-plane binaries are absent.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import yaml
from common import percentiles, rss_mib, serve_command
from dra_shapes import bench_shapes

from devplug.api.dra.v1 import api_pb2 as dra
from devplug.api.dra.v1 import api_pb2_grpc as dra_grpc
from devplug.framework.channel import FAST_RECONNECT
from devplug.testing.controlplane import ControlPlane, how_to_provide, watch_until

ROOT = Path(__file__).resolve().parent.parent
DRIVER = "bench.devplug.io"
NODE = "bench-node"
DEVICES = 8
CLAIMS = 50
HOTPLUG_ROUNDS = 5


def bench_dra(root: Path) -> dict[str, Any]:
    plane = ControlPlane.find(ROOT)
    if plane is None:
        return {"skipped": how_to_provide(ROOT)}
    started = time.monotonic()
    kubeconfig = plane.start()
    report: dict[str, Any] = {"control_plane_start_s": round(time.monotonic() - started, 2)}
    try:
        report.update(_bench(root / "dra", kubeconfig))
        report["shapes"] = bench_shapes(root / "dra-shapes", kubeconfig)
    finally:
        plane.stop()
    return report


def _bench(root: Path, kubeconfig: str) -> dict[str, Any]:
    from kubernetes import client

    from devplug.framework.dra.kube import api_client

    api = api_client(kubeconfig)
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    dev = root / "dev"
    dev.mkdir(parents=True)
    for i in range(DEVICES):
        os.mknod(dev / f"acc{i}", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    config = root / "dra.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "resources": [
                    {
                        "name": "bench.devplug.io/acc",
                        "mode": "dra",
                        "allowAnyPath": True,
                        "dra": {"driver": DRIVER, "attributes": {"model": "bench"}},
                        "groups": [{"paths": [{"path": f"{dev}/acc*"}]}],
                    }
                ]
            }
        )
    )
    names: list[str] = []

    def has(count: int) -> Any:
        def match(obj: dict[str, Any]) -> bool:
            spec = obj["spec"]
            found = [d["name"] for d in spec.get("devices") or []]
            if spec["driver"] == DRIVER and len(found) >= count:
                names[:] = found
                return True
            return False

        return match

    report: dict[str, Any] = {}
    started = time.monotonic()
    folders = {"--registry-dir": "reg", "--dra-socket-dir": "pl", "--cdi-dir": "cdi"}
    args = [item for flag, name in folders.items() for item in (flag, str(root / name))]
    args += ["--node-name", NODE, "--kubeconfig", kubeconfig]
    proc = subprocess.Popen(
        serve_command(config, root / "dp", *args, log_level=None),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        watch_until(api, resource.list_resource_slice, has(DEVICES), timeout=60)
        report["start_to_slices_published_ms"] = round((time.monotonic() - started) * 1000, 1)
        report["rss_mib"] = rss_mib(proc.pid)

        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": namespace}})
        claims = []
        for i in range(CLAIMS):
            claim = resource.create_namespaced_resource_claim(
                namespace,
                {
                    "metadata": {"name": f"c{i}"},
                    "spec": {
                        "devices": {
                            "requests": [{"name": "acc", "exactly": {"deviceClassName": DRIVER}}]
                        }
                    },
                },
            )
            results = [
                {"request": "acc", "driver": DRIVER, "pool": NODE, "device": names[i % DEVICES]}
            ]
            resource.patch_namespaced_resource_claim_status(
                f"c{i}", namespace, {"status": {"allocation": {"devices": {"results": results}}}}
            )
            claims.append(dra.Claim(namespace=namespace, name=f"c{i}", uid=claim.metadata.uid))
        socket = root / "pl" / DRIVER / "dra.sock"
        with grpc.insecure_channel(f"unix://{socket}", options=FAST_RECONNECT) as channel:
            stub = dra_grpc.DRAPluginStub(channel)

            def prepare(claim: dra.Claim) -> float:
                begin = time.perf_counter()
                answer = stub.NodePrepareResources(
                    dra.NodePrepareResourcesRequest(claims=[claim]), timeout=10
                )
                if answer.claims[claim.uid].error:
                    raise RuntimeError(answer.claims[claim.uid].error)
                return time.perf_counter() - begin

            def unprepare(claim: dra.Claim) -> float:
                begin = time.perf_counter()
                stub.NodeUnprepareResources(
                    dra.NodeUnprepareResourcesRequest(claims=[claim]), timeout=10
                )
                return time.perf_counter() - begin

            stub.NodePrepareResources(dra.NodePrepareResourcesRequest(), wait_for_ready=True)
            report["prepare"] = percentiles([prepare(c) for c in claims])
            report["prepare_again"] = percentiles([prepare(c) for c in claims])
            report["unprepare"] = percentiles([unprepare(c) for c in claims])

        samples = []
        for i in range(HOTPLUG_ROUNDS):
            begin = time.perf_counter()
            os.mknod(dev / f"acc-hot{i}", stat.S_IFCHR | 0o666, os.makedev(1, 3))
            watch_until(api, resource.list_resource_slice, has(DEVICES + i + 1), timeout=30)
            samples.append(time.perf_counter() - begin)
        report["hotplug_to_slice"] = percentiles(samples)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
        api.close()
    return report
