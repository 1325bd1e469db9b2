"""The generic device plugin beside devplug, on the same `--device` flags: start to
every resource registered and listed with the kubelet (simulator), Allocate latency of
one device (sequential, a grpcio client on each plugin's socket), and RSS after.

Its binary is given by $GDP_BIN (built from its own source); without it the section
says so and measures nothing. devplug runs as its DaemonSet runs the image: the flags
alone, after the `devplug` entry point.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
from common import allocate_request, percentiles, proc_status, rss_mib, timed_calls

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc

RUNS = 5
ALLOCATE_CALLS = 1000
NODES = 16
DOMAIN = "bench.example"
NODE = f"{DOMAIN}/node"
SHARED = f"{DOMAIN}/shared"


def bench_gdp(root: Path) -> dict[str, Any]:
    binary = os.environ.get("GDP_BIN")
    if not binary:
        return {
            "skipped": "GDP_BIN is not set: give the generic device plugin's binary to "
            "measure it beside devplug on the same --device flags"
        }
    if not os.access(binary, os.X_OK):
        return {"skipped": f"GDP_BIN={binary} is not an executable file"}
    return asyncio.run(_bench(root / "gdp", binary))


def _flags(dev: Path, plugin_dir: Path) -> list[str]:
    devices = [
        {"name": "node", "groups": [{"paths": [{"path": f"{dev}/node*"}]}]},
        {"name": "shared", "groups": [{"count": 10, "paths": [{"path": f"{dev}/shared"}]}]},
    ]
    flags = [w for d in devices for w in ("--device", json.dumps(d))]
    return [
        *flags,
        f"--domain={DOMAIN}",
        f"--plugin-directory={plugin_dir}",
        "--listen=127.0.0.1:0",
    ]


def _socket(plugin_dir: Path, kind: str, resource: str) -> Path:
    if kind == "devplug":
        return plugin_dir / ("devplug-" + resource.replace("/", "-") + ".sock")
    prefix = "gdp-" + base64.b64encode(resource.encode()).decode() + "-"
    [found] = [p for p in plugin_dir.iterdir() if p.name.startswith(prefix)]
    return found


async def _bench(root: Path, binary: str) -> dict[str, Any]:
    from devplug.simulator import Kubelet

    logging.getLogger("devplug").setLevel(logging.ERROR)
    dev = root / "dev"
    dev.mkdir(parents=True)
    for name in [f"node{i}" for i in range(NODES)] + ["shared"]:
        os.mknod(dev / name, 0o20666, os.makedev(1, 3))
    plugin_dir = root / "plugins"
    flags = _flags(dev, plugin_dir)
    commands = {
        "generic_device_plugin": [binary, *flags],
        "devplug": [sys.executable, "-m", "devplug.cli.main", "--log-level=warning", *flags],
    }
    found: dict[str, dict[str, list[float]]] = {k: {} for k in commands}
    async with Kubelet(plugin_dir, root / "state", control_socket=False) as kubelet:
        for run in range(RUNS):
            for kind, command in commands.items():
                samples = found[kind]
                after = kubelet.last_event_seq
                started = time.time()
                proc = await asyncio.create_subprocess_exec(
                    *command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
                try:
                    await _all_listed(kubelet, after)
                    registered = max(
                        e.time for e in kubelet.events if e.seq > after and e.kind == "devices"
                    )
                    samples.setdefault("listed_ms", []).append((registered - started) * 1000)
                    if run == 0:
                        samples |= await asyncio.to_thread(_allocate, plugin_dir, kind, proc.pid)
                finally:
                    # Both remove their sockets before they exit.
                    proc.terminate()
                    await proc.wait()
    report: dict[str, Any] = {"runs": RUNS, "devices": {NODE: NODES, SHARED: 10}}
    for kind, samples in found.items():
        listed = samples.pop("listed_ms")
        report[kind] = {
            "start_to_listed_ms": {
                "median": round(statistics.median(listed), 1),
                "min": round(min(listed), 1),
                "max": round(max(listed), 1),
            },
            **samples,
        }
    return report


async def _all_listed(kubelet: Any, after: int) -> None:
    def done() -> bool:
        listed = {e.resource for e in kubelet.events if e.seq > after and e.kind == "devices"}
        return {NODE, SHARED} <= listed

    await kubelet.wait_for(done, 60, "both resources listed")


def _allocate(plugin_dir: Path, kind: str, pid: int) -> dict[str, Any]:
    """Allocate of one node device, `ALLOCATE_CALLS` times; RSS before and after."""
    rss_before = rss_mib(pid)
    channel = grpc.insecure_channel(f"unix://{_socket(plugin_dir, kind, NODE)}")
    try:
        stub = pb_grpc.DevicePluginStub(channel)
        first = next(iter(stub.ListAndWatch(pb.Empty(), timeout=30)))
        ids = [d.ID for d in first.devices]
        request = allocate_request([ids[0]])
        samples = timed_calls(lambda: stub.Allocate(request, timeout=10), ALLOCATE_CALLS)
    finally:
        channel.close()
    return {
        "allocate": percentiles(samples),
        "rss_mib": {"listed": rss_before, "after_allocate": rss_mib(pid)},
        "rss_anon_mib": round(proc_status(pid, "RssAnon") / 1024, 1),
        "node_devices_listed": len(ids),
    }


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory(prefix="dp-gdp-") as tmp:
        print(json.dumps(bench_gdp(Path(tmp)), indent=2))
