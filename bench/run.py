"""devplug benchmark: the daemon and the simulator measured on this machine.

Prints one JSON document on stdout and a one-line summary on stderr. Everything runs
over real unix sockets against a real `devplug serve` process, with a Python grpcio
client, the way the kubelet talks to a plugin (the kubelet's client is Go, so these
latencies include Python client overhead the kubelet does not have).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc
from common import (
    allocate_request,
    cpu_seconds,
    daemon,
    percentiles,
    rss_mib,
    serve_command,
    stub_for,
    timed_calls,
    wait_for_health,
)
from dra import bench_dra
from extender import bench_extender
from extender import summary as extender_summary
from fleet import bench_fleet
from floor import bench_floor
from floor import summary as floor_summary
from gdp import bench_gdp
from kubeclient import bench_kubeclient
from kubeclient import summary as kubeclient_summary
from nvidia import bench_nvidia
from placement import bench_placement
from placement import summary as placement_summary
from realnode import bench_real_node
from simulator import bench_admission
from simulator import summary as admission_summary
from sysfs import bench_sysfs

from deploy import bench_deploy
from devplug.api.v1beta1 import api_pb2 as pb

SEQUENTIAL_CALLS = 3000
CONCURRENT_CLIENTS = 8
CONCURRENT_CALLS = 500  # per client
IDLE_SECONDS = 10.0
HEALTH_ROUNDS = 10
REREGISTER_ROUNDS = 50
BIG_LIST = 10_000
REPO = Path(__file__).resolve().parent.parent
SIM_RESOURCE = "bench.devplug.io/sim"
SIM_DEVICES = 1000
TARGETS = {
    "allocate_seq_p50_ms": 0.8,
    "allocate_seq_p99_ms": 2.5,
    "reregister_p99_ms": 200.0,
    "health_max_ms": 1000.0,
    "idle_cpu_percent": 0.5,
    "rss_idle_mib": 40.0,
}


def write_config(root: Path, nodes: Path) -> Path:
    config = root / "bench.yaml"
    config.write_text(
        f"""resources:
  - name: bench.devplug.io/alloc
    virtual: 16
  - name: bench.devplug.io/node
    allowAnyPath: true
    groups:
      - paths:
          - path: {nodes}/bench*
"""
    )
    return config


def bench_allocate(plugin_dir: Path) -> dict[str, Any]:
    channel, stub = stub_for(plugin_dir, "bench.devplug.io/alloc")
    request = allocate_request(["alloc-1", "alloc-2"])
    with channel:
        timed_calls(lambda: stub.Allocate(request), 300)  # warm-up
        sequential = timed_calls(lambda: stub.Allocate(request), SEQUENTIAL_CALLS)
    results: list[list[float]] = []

    def client() -> None:
        ch, st = stub_for(plugin_dir, "bench.devplug.io/alloc")
        with ch:
            timed_calls(lambda: st.Allocate(request), 50)
            barrier.wait()
            results.append(timed_calls(lambda: st.Allocate(request), CONCURRENT_CALLS))

    barrier = threading.Barrier(CONCURRENT_CLIENTS + 1)
    threads = [threading.Thread(target=client) for _ in range(CONCURRENT_CLIENTS)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    concurrent = [s for r in results for s in r]
    return {
        "sequential": percentiles(sequential),
        "sequential_calls_per_s": round(len(sequential) / sum(sequential)),
        "concurrent_8": percentiles(concurrent),
        "concurrent_calls_per_s": round(len(concurrent) / elapsed),
    }


def bench_health(plugin_dir: Path, nodes: Path) -> dict[str, Any]:
    channel, stub = stub_for(plugin_dir, "bench.devplug.io/node")
    node = nodes / "bench0"
    down, up = [], []
    with channel:
        stream = stub.ListAndWatch(pb.Empty())
        [device] = [d.ID for d in next(stream).devices]  # the ID derives from the path
        assert device.endswith("bench0"), device
        for _ in range(HEALTH_ROUNDS):
            started = time.perf_counter()
            node.unlink()
            wait_for_health(stream, device, "Unhealthy")
            down.append(time.perf_counter() - started)
            started = time.perf_counter()
            os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
            wait_for_health(stream, device, "Healthy")
            up.append(time.perf_counter() - started)
        stream.cancel()
    return {"removed_to_unhealthy": percentiles(down), "restored_to_healthy": percentiles(up)}


def bench_big_list(plugin_dir: Path) -> dict[str, Any]:
    channel, stub = stub_for(plugin_dir, "bench.devplug.io/big")
    samples, size = [], 0
    ids = [f"big-{i}" for i in range(BIG_LIST)]
    unknown = [f"nope-{i}" for i in range(BIG_LIST)]

    def allocate(devices: list[str]) -> None:
        try:
            stub.Allocate(allocate_request(devices), timeout=30)
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.INVALID_ARGUMENT:
                raise

    with channel:
        answered = timed_calls(lambda: allocate(ids), 5)
        refused = timed_calls(lambda: allocate(unknown), 5)
        for _ in range(5):
            started = time.perf_counter()
            stream = stub.ListAndWatch(pb.Empty())
            first = next(stream)
            samples.append(time.perf_counter() - started)
            size = len(first.devices)
            stream.cancel()
    return {
        "devices": size,
        "first_list": percentiles(samples),
        "allocate_all_10k": percentiles(answered),
        "allocate_10k_unknown_refused": percentiles(refused),
    }


def bench_idle(pid: int) -> dict[str, Any]:
    before = cpu_seconds(pid)
    started = time.monotonic()
    time.sleep(IDLE_SECONDS)  # measuring idleness: nothing to wait for but time
    used = cpu_seconds(pid) - before
    wall = time.monotonic() - started
    return {"seconds": round(wall, 1), "cpu_percent": round(100 * used / wall, 3)}


def main() -> int:
    report: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    with tempfile.TemporaryDirectory(prefix="devplug-bench-") as tmp:
        root = Path(tmp)
        nodes = root / "dev"
        nodes.mkdir()
        os.mknod(nodes / "bench0", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        plugin_dir = root / "plugins"
        config = write_config(root, nodes)
        with daemon(config, plugin_dir) as proc:
            for resource in ("alloc", "node"):
                stub_for(plugin_dir, f"bench.devplug.io/{resource}")[0].close()
            report["idle"] = bench_idle(proc.pid)
            report["rss_idle_mib"] = rss_mib(proc.pid)
            report["allocate"] = bench_allocate(plugin_dir)
            report["health"] = bench_health(plugin_dir, nodes)
            report["rss_after_load_mib"] = rss_mib(proc.pid)
        big = root / "big.yaml"
        big.write_text(f"resources:\n  - name: bench.devplug.io/big\n    virtual: {BIG_LIST}\n")
        with daemon(big, root / "big-plugins") as proc:
            report["list_and_watch_10k"] = bench_big_list(root / "big-plugins")
            report["list_and_watch_10k"]["rss_mib"] = rss_mib(proc.pid)
        report.update(run_async_benches(root))
        report["simulator"] = bench_admission(root, REPO)
        report["sysfs_hotplug"] = bench_sysfs(root)
        report["dra"] = bench_dra(root)
        report["fleet"] = bench_fleet(root)
        report["kubeclient"] = bench_kubeclient(root)
        from startup import bench_startup  # bench/startup.py

        report["startup"] = bench_startup(root)
        report["gdp"] = bench_gdp(root)
        report["floor"] = bench_floor(root)
    report["deploy"] = bench_deploy()
    report["nvidia"] = bench_nvidia()
    report["placement"] = bench_placement()
    report["extender"] = bench_extender()
    report["real_node"] = bench_real_node()
    report["targets"] = TARGETS
    print(json.dumps(report, indent=2))
    print(summary(report), file=sys.stderr)
    return 0


def run_async_benches(root: Path) -> dict[str, Any]:
    """Benchmarks that need the kubelet simulator (re-registration, admission)."""
    return asyncio.run(_async_benches(root))


async def _async_benches(root: Path) -> dict[str, Any]:
    from devplug.api.constants import KUBELET_SOCKET
    from devplug.simulator import Kubelet

    plugin_dir = root / "sim-plugins"
    config = root / "sim.yaml"
    config.write_text(
        f"""resources:
  - name: {SIM_RESOURCE}
    virtual: {SIM_DEVICES}
  - name: bench.devplug.io/second
    virtual: 4
"""
    )
    proc = await asyncio.create_subprocess_exec(*serve_command(config, plugin_dir))
    results: dict[str, Any] = {}
    try:
        async with Kubelet(plugin_dir, root / "sim-state", control_socket=False) as kubelet:
            await kubelet.wait_for_resource(SIM_RESOURCE, count=SIM_DEVICES, timeout=30)
            await kubelet.wait_for_resource("bench.devplug.io/second", count=4, timeout=30)
            samples = []
            for round_ in range(1, REREGISTER_ROUNDS + 1):
                await kubelet.restart()
                created = (plugin_dir / KUBELET_SOCKET).stat().st_ctime_ns / 1e9
                for resource in (SIM_RESOURCE, "bench.devplug.io/second"):
                    await kubelet.wait_for_registration(resource, after=round_)
                    event = [
                        e
                        for e in kubelet.events
                        if e.kind == "registered" and e.resource == resource
                    ][round_]
                    samples.append(event.time - created)
            results["reregister"] = percentiles(samples) | {"rounds": REREGISTER_ROUNDS}
    finally:
        proc.send_signal(signal.SIGTERM)
        await proc.wait()
    return results


def summary(report: dict[str, Any]) -> str:
    alloc = report["allocate"]
    seq, conc = alloc["sequential"], alloc["concurrent_8"]
    parts = [
        f"allocate p50 {seq['p50_ms']} ms p99 {seq['p99_ms']} ms",
        f"8 clients p50 {conc['p50_ms']} ms p99 {conc['p99_ms']} ms"
        f" ({alloc['concurrent_calls_per_s']}/s)",
        f"health {report['health']['removed_to_unhealthy']['max_ms']} ms max",
        f"10k list {report['list_and_watch_10k']['first_list']['p50_ms']} ms",
        f"10k-ID allocate {report['list_and_watch_10k']['allocate_all_10k']['max_ms']} ms",
        f"idle cpu {report['idle']['cpu_percent']}%",
        f"rss {report['rss_idle_mib']}/{report['rss_after_load_mib']} MiB",
    ]
    if "reregister" in report:
        parts.append(f"re-register p99 {report['reregister']['p99_ms']} ms")
    if "simulator" in report:
        parts.append(admission_summary(report["simulator"]))
    fleet = report.get("fleet", {})
    if "end_to_end" in fleet:
        parts.append(
            f"fleet {fleet['nodes']} nodes in {fleet['registered_s']} s, "
            f"{fleet['end_to_end']['pods_per_s']} pods/s"
        )
    if report.get("kubeclient", {}).get("devplug"):
        parts.append(kubeclient_summary(report["kubeclient"]))
    if "startup" in report:
        start = report["startup"]
        parts.append(
            f"serve start to all registered {start['all_registered_ms']['median']} ms, "
            f"SIGTERM to exit {start['sigterm_to_exit_ms']['median']} ms"
        )
    if "nvidia" in report:
        gpus = report["nvidia"]
        parts.append(
            f"gpu allocate p50 {gpus['allocate_1_gpu']['p50_ms']} ms, "
            f"xid->unhealthy p50 {gpus['xid_to_unhealthy']['p50_ms']} ms"
        )
    gdp = report.get("gdp", {})
    if "devplug" in gdp:
        theirs, ours = gdp["generic_device_plugin"], gdp["devplug"]
        parts.append(
            f"beside the generic device plugin: listed {ours['start_to_listed_ms']['median']} "
            f"vs {theirs['start_to_listed_ms']['median']} ms, allocate p50 "
            f"{ours['allocate']['p50_ms']} vs {theirs['allocate']['p50_ms']} ms, rss "
            f"{ours['rss_mib']['after_allocate']} vs {theirs['rss_mib']['after_allocate']} MiB"
        )
    if "floor" in report:
        parts.append(floor_summary(report["floor"]))
    if "placement" in report:
        parts.append(placement_summary(report["placement"]))
    if "extender" in report:
        parts.append(extender_summary(report["extender"]))
    real = report.get("real_node", {})
    if "kubelet_sigkill" in real:
        kill, pod = real["kubelet_sigkill"], real["plugin_pod_deleted"]
        parts.append(
            f"real kubelet SIGKILL -> registered {kill['registered_s']['median']} s, "
            f"allocatable {kill['allocatable_back_s']['median']} s; plugin pod deleted -> "
            f"allocatable {pod['allocatable_back_s']['median']} s"
        )
    elif "skipped" in real:
        parts.append("real node skipped")
    return "bench: " + ", ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
