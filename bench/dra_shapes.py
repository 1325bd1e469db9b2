"""DRA partitions and shares against a real control plane: an 8-GPU node with every GPU
in MIG mode (fake NVML, H100 tables) published as MIG partitions (start until every
slice is there, how many slices and devices, their size), NodePrepareResources of MIG
partitions (the GPU and compute instance made through NVML) and of their unprepare,
and NodePrepareResources of shares of a device shared by capacity, beside that of a
whole device in the same run.

Called by bench/dra.py with its control plane; numbers go under "dra" -> "shapes".
"""

from __future__ import annotations

import json
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

from devplug.api.dra.v1 import api_pb2 as dra
from devplug.api.dra.v1 import api_pb2_grpc as dra_grpc
from devplug.fakes.gpus import FakeGpuHost, gpu
from devplug.ground.channel import FAST_RECONNECT
from devplug.testing.controlplane import watch_until

NODE = "bench-shapes"
MIG_DRIVER = "mig.bench.devplug.io"
SHARE_DRIVER = "link.bench.devplug.io"
GPUS = 8
SHARES = 50


def bench_shapes(root: Path, kubeconfig: str) -> dict[str, Any]:
    from kubernetes import client

    from devplug.testing.official import api_client

    api = api_client(kubeconfig)
    try:
        core = client.CoreV1Api(api)
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        namespace = f"shapes-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": namespace}})
        return {
            "mig_8_gpus": _mig(root / "mig", api, kubeconfig, namespace),
            "shares": _shares(root / "shares", api, kubeconfig, namespace),
        }
    finally:
        api.close()


def _serve(root: Path, config: Path, kubeconfig: str, env: dict[str, str]) -> Any:
    folders = {"--registry-dir": "reg", "--dra-socket-dir": "pl", "--cdi-dir": "cdi"}
    args = [item for flag, name in folders.items() for item in (flag, str(root / name))]
    args += ["--node-name", NODE, "--kubeconfig", kubeconfig]
    command = serve_command(config, root / "dp", *args, log_level=None)
    return subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **env},
    )


def _pool(api: Any, driver: str) -> list[dict[str, Any]]:
    """The slices of `driver`'s pool once it is complete (every slice of one
    generation there)."""
    from kubernetes import client

    resource = client.ResourceV1Api(api)
    seen: dict[str, dict[str, Any]] = {}

    def complete(obj: dict[str, Any]) -> bool:
        spec = obj["spec"]
        if spec["driver"] != driver:
            return False
        seen[obj["metadata"]["name"]] = obj
        generation = spec["pool"]["generation"]
        same = [s for s in seen.values() if s["spec"]["pool"]["generation"] == generation]
        return len(same) == spec["pool"]["resourceSliceCount"]

    watch_until(api, resource.list_resource_slice, complete, timeout=120)
    newest = max(s["spec"]["pool"]["generation"] for s in seen.values())
    return [s for s in seen.values() if s["spec"]["pool"]["generation"] == newest]


def _claims(
    api: Any, namespace: str, driver: str, results: list[dict[str, Any]], prefix: str
) -> list[dra.Claim]:
    """A claim per result, allocated to it (as the scheduler writes it)."""
    from kubernetes import client

    resource = client.ResourceV1Api(api)
    claims = []
    for i, result in enumerate(results):
        name = f"{prefix}{i}"
        request = {"name": "r", "exactly": {"deviceClassName": driver}}
        made = resource.create_namespaced_resource_claim(
            namespace, {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}}
        )
        full = {"request": "r", "driver": driver, "pool": NODE, **result}
        resource.patch_namespaced_resource_claim_status(
            name, namespace, {"status": {"allocation": {"devices": {"results": [full]}}}}
        )
        claims.append(dra.Claim(namespace=namespace, name=name, uid=made.metadata.uid))
    return claims


def _timed(socket: Path, claims: list[dra.Claim]) -> dict[str, dict[str, float]]:
    """NodePrepareResources of each claim, then NodeUnprepareResources of each."""
    with grpc.insecure_channel(f"unix://{socket}", options=FAST_RECONNECT) as channel:
        stub = dra_grpc.DRAPluginStub(channel)
        stub.NodePrepareResources(dra.NodePrepareResourcesRequest(), wait_for_ready=True)
        calls = (
            ("prepare", stub.NodePrepareResources, dra.NodePrepareResourcesRequest),
            ("unprepare", stub.NodeUnprepareResources, dra.NodeUnprepareResourcesRequest),
        )
        report = {}
        for key, call, message in calls:
            samples = []
            for claim in claims:
                begin = time.perf_counter()
                answer = call(message(claims=[claim]), timeout=30)
                if answer.claims[claim.uid].error:
                    raise RuntimeError(answer.claims[claim.uid].error)
                samples.append(time.perf_counter() - begin)
            report[key] = percentiles(samples)
    return report


def _mig(root: Path, api: Any, kubeconfig: str, namespace: str) -> dict[str, Any]:
    root.mkdir(parents=True)
    gpus = [gpu(i, model_key="H100-SXM5-80GB", numa=i // 4, mig=[]) for i in range(GPUS)]
    host = FakeGpuHost(root / "gpus", {"driver": {"loaded": True}, "gpus": gpus, "events": []})
    entry = {
        "nvidia": {"hostRoot": host.host_root},
        "mode": "dra",
        "dra": {"driver": MIG_DRIVER, "partitions": {"mig": True}},
    }
    config = root / "mig.yaml"
    config.write_text(yaml.safe_dump({"resources": [entry]}))
    started = time.monotonic()
    proc = _serve(root, config, kubeconfig, host.env)
    try:
        slices = _pool(api, MIG_DRIVER)
        report: dict[str, Any] = {"start_to_slices_published_ms": _ms(started)}
        report["rss_mib"] = rss_mib(proc.pid)
        devices = [d for s in slices for d in s["spec"].get("devices", [])]
        sizes = [len(json.dumps(s["spec"])) for s in slices]
        report.update(
            slices=len(slices),
            counter_slices=sum("sharedCounters" in s["spec"] for s in slices),
            devices=len(devices),
            devices_per_slice_max=max(len(s["spec"].get("devices", [])) for s in slices),
            slice_spec_kib_total=round(sum(sizes) / 1024, 1),
            slice_spec_kib_max=round(max(sizes) / 1024, 1),
        )
        # Seven 1g.10gb per GPU: partitions that never overlap, each a MIG instance made.
        small = [d for d in devices if d["attributes"]["migProfile"]["string"] == "1g.10gb"]
        report["partitions_prepared"] = len(small)
        claims = _claims(api, namespace, MIG_DRIVER, [{"device": d["name"]} for d in small], "m")
        report.update(_timed(root / "pl" / MIG_DRIVER / "dra.sock", claims))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    return report


def _shares(root: Path, api: Any, kubeconfig: str, namespace: str) -> dict[str, Any]:
    root.mkdir(parents=True)
    for name in ("link0", "whole0"):
        os.mknod(root / name, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    link = {
        "name": "bench.devplug.io/link",
        "mode": "dra",
        "allowAnyPath": True,
        "dra": {
            "driver": SHARE_DRIVER,
            "consumableCapacity": {
                "bandwidth": {
                    "value": "1000G",
                    "requestPolicy": {"default": "1G", "validRange": {"min": "1G", "step": "1G"}},
                }
            },
        },
        "groups": [{"id": "link0", "paths": [{"path": str(root / "link0")}]}],
    }
    whole = {
        "name": "bench.devplug.io/whole",
        "mode": "dra",
        "allowAnyPath": True,
        "dra": {"driver": f"whole.{SHARE_DRIVER}"},
        "groups": [{"id": "whole0", "paths": [{"path": str(root / "whole0")}]}],
    }
    config = root / "shares.yaml"
    config.write_text(yaml.safe_dump({"resources": [link, whole]}))
    proc = _serve(root, config, kubeconfig, {})
    try:
        _pool(api, SHARE_DRIVER)
        _pool(api, f"whole.{SHARE_DRIVER}")
        one = {"bandwidth": "1G"}
        results = [
            {"device": "link0", "shareID": str(uuid.uuid4()), "consumedCapacity": one}
            for _ in range(SHARES)
        ]
        claims = _claims(api, namespace, SHARE_DRIVER, results, "s")
        report: dict[str, Any] = {"shares_prepared": SHARES}
        report["share"] = _timed(root / "pl" / SHARE_DRIVER / "dra.sock", claims)
        # The same device whole, one claim at a time (prepared, then unprepared).
        wholes = _claims(api, namespace, f"whole.{SHARE_DRIVER}", [{"device": "whole0"}], "w")
        socket = root / "pl" / f"whole.{SHARE_DRIVER}" / "dra.sock"
        samples = [_timed(socket, wholes)["prepare"]["p50_ms"] for _ in range(SHARES // 5)]
        report["whole_prepare_p50_ms"] = sorted(samples)[len(samples) // 2]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    return report


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)
