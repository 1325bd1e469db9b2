"""A short check of MIG partitions through DRA on a host with NVIDIA GPUs: `devplug
serve` with `dra.partitions.mig` publishes the slices it would send the API server
into a folder; for the first GPU already in MIG mode, a claim for its smallest profile
is prepared through the real node plugin (the MIG instance made), its CDI spec shown,
and unprepared (the instance destroyed). MIG mode is never changed: where no GPU has it
on, the check says so and stops after the slices.

    tools/mig-partitions-check.sh          # the real driver (as root, MIG mode already on)
    tools/mig-partitions-check.sh --fake   # the fake NVML (an A100 40GB in MIG mode)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import yaml

from devplug.api.dra.v1 import api_pb2 as dra
from devplug.api.dra.v1 import api_pb2_grpc as dra_grpc
from devplug.ground.channel import FAST_RECONNECT

DRIVER = "mig.check.devplug.io"
NODE = "mig-check"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake", action="store_true", help="use the fake NVML (one A100)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mig-check-") as tmp:
        root = Path(tmp)
        nvidia: dict[str, object] = {}
        env: dict[str, str] = {}
        if args.fake:
            from devplug.fakes.gpus import FakeGpuHost, gpu

            description = {
                "driver": {"loaded": True},
                "gpus": [gpu(0, model_key="A100-SXM4-40GB", mig=[])],
            }
            host = FakeGpuHost(root / "fake", description)
            nvidia["hostRoot"] = host.host_root
            env = host.env
        entry = {
            "nvidia": nvidia,
            "mode": "dra",
            "dra": {"driver": DRIVER, "partitions": {"mig": True}},
        }
        config = root / "config.yaml"
        config.write_text(yaml.safe_dump({"resources": [entry]}))
        claims = root / "claims"
        command = [sys.executable, "-m", "devplug.cli.main", "serve", "--config", str(config)]
        for flag, name in (
            ("--plugin-dir", "dp"),
            ("--registry-dir", "reg"),
            ("--dra-socket-dir", "pl"),
            ("--cdi-dir", "cdi"),
        ):
            command += [flag, str(root / name)]
        command += ["--node-name", NODE, "--claims-dir", str(claims)]
        proc = subprocess.Popen(
            command, env={**os.environ, **env}, stderr=subprocess.PIPE, text=True
        )
        try:
            return _check(root, claims, proc)
        finally:
            proc.terminate()
            _, log = proc.communicate(timeout=15)
            print("== daemon log")
            print(log.rstrip())


def _check(root: Path, claims: Path, proc: subprocess.Popen[str]) -> int:
    socket = root / "pl" / DRIVER / "dra.sock"
    with grpc.insecure_channel(f"unix://{socket}", options=FAST_RECONNECT) as channel:
        stub = dra_grpc.DRAPluginStub(channel)
        stub.NodePrepareResources(
            dra.NodePrepareResourcesRequest(), wait_for_ready=True, timeout=60
        )
        slices = [json.loads(p.read_text()) for p in sorted(claims.glob("*.json"))]
        devices = [d for s in slices for d in s["spec"].get("devices", [])]
        migs = [d for d in devices if "migProfile" in d.get("attributes", {})]
        print(f"== slices: {len(slices)}, {len(devices)} device(s), {len(migs)} MIG partition(s)")
        for s in slices:
            for counters in s["spec"].get("sharedCounters", []):
                print(f"  counter set {counters['name']}: {len(counters['counters'])} counters")
        if not migs:
            print("no GPU in MIG mode (devplug never enables it): stopping here")
            return 0
        smallest = min(migs, key=lambda d: int(d["capacity"]["memory"]["value"]))
        print(f"== claim for {smallest['name']} ({_profile(smallest)})")
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "check", "namespace": "default", "uid": "mig-check-1"},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "r",
                                "driver": DRIVER,
                                "pool": NODE,
                                "device": smallest["name"],
                            }
                        ]
                    }
                }
            },
        }
        (claims / "check.yaml").write_text(yaml.safe_dump(claim))
        ref = dra.Claim(namespace="default", name="check", uid="mig-check-1")
        answer, took = _timed(stub.NodePrepareResources, dra.NodePrepareResourcesRequest, ref)
        if error := answer.claims[ref.uid].error:
            print(f"prepare failed: {error}")
            return 1
        ids = list(answer.claims[ref.uid].devices[0].cdi_device_ids)
        print(f"prepared in {took:.1f} ms: {ids}")
        spec = json.loads((root / "cdi" / f"{DRIVER}-{ref.uid}.json").read_text())
        print(json.dumps(spec["containerEdits"], indent=1))
        undone, took = _timed(stub.NodeUnprepareResources, dra.NodeUnprepareResourcesRequest, ref)
        if error := undone.claims[ref.uid].error:
            print(f"unprepare failed: {error}")
            return 1
        print(f"unprepared in {took:.1f} ms (the MIG instance destroyed)")
    return 0


def _timed(call: Any, message: Any, claim: dra.Claim) -> tuple[Any, float]:
    """The answer of one claim's call, and its milliseconds."""
    begin = time.perf_counter()
    answer = call(message(claims=[claim]), timeout=60)
    return answer, (time.perf_counter() - begin) * 1000


def _profile(device: dict[str, Any]) -> str:
    return str(device["attributes"]["migProfile"]["string"])


if __name__ == "__main__":
    sys.exit(main())
