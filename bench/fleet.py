"""`devplug fleet` against the real kube-apiserver, etcd and kube-scheduler: nodes
registered, pods scheduled by the real scheduler and admitted by the fleet's kubelet
stand-ins end to end, the CPU each process spent on it, the fleet's memory per node,
and the lean API client beside the official asyncio client on the same calls.

`make bench` runs it at 100 nodes (`bench_fleet(root)`); `make fleet-bench-synthetic` at
1,000 nodes and 10,000 pods (`python bench/fleet.py --nodes 1000 --pods 10000`). Skipped,
with the reason, where the control-plane binaries are absent. `--openb` runs openb's
trace on a fleet of its node list through the real scheduler and devplug's extender,
beside the planner (bench/fleet_trace.py; `make fleet-bench`).

The pods go to a kube-scheduler of the benchmark's own (the same binary, its own
scheduler name) so that its metrics endpoint can be read; the control plane's own
scheduler ignores them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import cpu_of, cpu_seconds, own_cpu, pids_with, rss_mib
from fleet_dra import QPS, bench_fleet_dra

from devplug.testing.components import Component, parse_metrics, scheduler_summary
from devplug.testing.controlplane import ControlPlane, how_to_provide

ROOT = Path(__file__).resolve().parent.parent
SCHEDULER = "devplug-bench"
RESOURCE = "bench.devplug.io/gpu"
DEVICES_PER_NODE = 8
SHARES = 2  # each device served twice: 10,000 pods fit on 1,000 nodes
CLIENT_CALLS = 300
NAMESPACE = "default"


def bench_fleet(
    root: Path, nodes: int = 100, pods: int = 800, qps: int | None = None
) -> dict[str, Any]:
    plane = ControlPlane.find(ROOT)
    if plane is None:
        return {"skipped": how_to_provide(ROOT)}
    kubeconfig = plane.start()
    try:
        return _bench(root / "fleet", kubeconfig, plane.bin_dir, nodes, pods, qps)
    finally:
        plane.stop()


def _fleet_file(folder: Path, nodes: int) -> Path:
    path = folder / "fleet.yaml"
    path.write_text(
        f"""name: bench
pools:
  - name: gpu
    count: {nodes}
    namePrefix: bench-gpu-
    cpu: 64
    memory: 512Gi
    config:
      resources:
        - name: {RESOURCE}
          virtual: {DEVICES_PER_NODE}
          count: {SHARES}
"""
    )
    return path


def _pod(index: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"bench-{index}", "namespace": NAMESPACE},
        "spec": {
            "schedulerName": SCHEDULER,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/bench:1",
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "128Mi"},
                        "limits": {RESOURCE: "1"},
                    },
                }
            ],
        },
    }


async def _compare_clients(kubeconfig: str) -> dict[str, Any]:
    """The same node status patches through the official asyncio client and the fleet's
    lean path: CPU per call in this process, and the ratio."""
    from kubernetes.aio import client, config

    from devplug.apiserver.client import MERGE_PATCH, KubeApi

    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "bench-client-node"}}
    patch = {"metadata": {"labels": {"bench": "x"}}}
    result: dict[str, Any] = {"calls": CLIENT_CALLS}
    async with KubeApi.from_kubeconfig(kubeconfig) as api:
        await api.call("POST", "/api/v1/nodes", body)
        started = own_cpu()
        for i in range(CLIENT_CALLS):
            patch["metadata"]["labels"]["bench"] = f"lean-{i}"
            await api.call(
                "PATCH", "/api/v1/nodes/bench-client-node", patch, content_type=MERGE_PATCH
            )
        result["lean_cpu_ms_per_call"] = round((own_cpu() - started) / CLIENT_CALLS * 1000, 3)
        settings = client.Configuration()
        await config.load_kube_config(config_file=kubeconfig, client_configuration=settings)
        async with client.ApiClient(settings) as official:
            core = client.CoreV1Api(official)
            await core.read_node("bench-client-node")  # warm-up: the first call loads models
            started = own_cpu()
            for i in range(CLIENT_CALLS):
                patch["metadata"]["labels"]["bench"] = f"official-{i}"
                await core.patch_node("bench-client-node", patch)
            result["official_aio_cpu_ms_per_call"] = round(
                (own_cpu() - started) / CLIENT_CALLS * 1000, 3
            )
        await api.call("DELETE", "/api/v1/nodes/bench-client-node")
    result["official_over_lean"] = round(
        result["official_aio_cpu_ms_per_call"] / max(result["lean_cpu_ms_per_call"], 1e-3), 2
    )
    return result


def _bench(
    folder: Path, kubeconfig: str, bin_dir: Path, nodes: int, pods: int, qps: int | None
) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    plane_dir = str(Path(kubeconfig).parent)
    apiserver = pids_with(f"--cert-dir={plane_dir}/certs")
    etcd = pids_with(f"--data-dir={plane_dir}/etcd")
    report: dict[str, Any] = {
        "nodes": nodes,
        "devices_per_node": DEVICES_PER_NODE,
        "shares_per_device": SHARES,
        "pods": pods,
    }
    report["scheduler_client_qps"] = qps or "default"
    scheduler = Component.scheduler(folder, kubeconfig, bin_dir, SCHEDULER, qps)
    fleet_file = _fleet_file(folder, nodes)
    command = [sys.executable, "-m", "devplug.cli.main", "--log-level", "warning", "fleet", "up"]
    command += ["-f", str(fleet_file), "--kubeconfig", kubeconfig, "-o", "json"]
    started = time.monotonic()
    fleet = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        scheduler.wait_ready()
        assert fleet.stdout is not None
        ready = json.loads(fleet.stdout.readline())
        report["registered_s"] = round(time.monotonic() - started, 2)
        report["fleet_register_s"] = ready["register_s"]
        report["rss_mib"] = ready["rss_mib"]
        report["rss_per_node_kib"] = round(
            (ready["rss_mib"] - ready["rss_before_nodes_mib"]) * 1024 / nodes, 1
        )
        report["end_to_end"] = asyncio.run(
            _pods_end_to_end(kubeconfig, pods, fleet.pid, scheduler.pid, apiserver, etcd)
        )
        report["end_to_end"]["scheduler_metrics"] = scheduler_summary(
            parse_metrics(scheduler.metrics()), SCHEDULER
        )
        report["rss_after_pods_mib"] = rss_mib(fleet.pid)
        report["client"] = asyncio.run(_compare_clients(kubeconfig))
    finally:
        fleet.send_signal(signal.SIGTERM)
        out, _ = fleet.communicate(timeout=60)
        scheduler.stop()
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    stopped = next((line for line in lines if line.get("event") == "stopped"), {})
    report["fleet_counters"] = {
        k: stopped.get(k)
        for k in (
            "admitted",
            "rejected",
            "status_writes",
            "lease_renewals",
            "lease_failures",
            "lease_late",
        )
    }
    started = time.monotonic()
    down = subprocess.run(
        [
            sys.executable,
            "-m",
            "devplug.cli.main",
            "fleet",
            "down",
            "-f",
            str(fleet_file),
            "--kubeconfig",
            kubeconfig,
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    report["down_s"] = round(time.monotonic() - started, 2)
    report["down"] = json.loads(down.stdout)
    return report


async def _pods_end_to_end(
    kubeconfig: str,
    count: int,
    fleet_pid: int,
    scheduler_pid: int,
    apiserver: list[int],
    etcd: list[int],
) -> dict[str, Any]:
    from devplug.apiserver.client import KubeApi

    async with KubeApi.from_kubeconfig(kubeconfig, concurrency=16) as api:
        return await _pods_through(api, count, fleet_pid, scheduler_pid, apiserver, etcd)


async def _pods_through(
    api: Any, count: int, fleet_pid: int, scheduler_pid: int, apiserver: list[int], etcd: list[int]
) -> dict[str, Any]:
    """Create `count` pods and wait until every one is Running (watched)."""
    import msgspec

    running: set[str] = set()
    done = asyncio.Event()
    listed = await api.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods", params={"limit": "1"})
    version = listed["metadata"]["resourceVersion"]

    async def watch() -> None:
        nonlocal version
        while not done.is_set():
            params = {"resourceVersion": version, "allowWatchBookmarks": "true"}
            async for line in api.watch(f"/api/v1/namespaces/{NAMESPACE}/pods", params, 300):
                event = msgspec.json.decode(line)
                obj = event.get("object") or {}
                version = obj.get("metadata", {}).get("resourceVersion", version)
                if (obj.get("status") or {}).get("phase") == "Running":
                    running.add(obj["metadata"]["name"])
                    if len(running) >= count:
                        done.set()
                        return

    cpu_before = {
        "fleet": cpu_seconds(fleet_pid),
        "scheduler": cpu_seconds(scheduler_pid),
        "apiserver": cpu_of(apiserver),
        "etcd": cpu_of(etcd),
        "bench_client": own_cpu(),
    }
    watcher = asyncio.create_task(watch())
    gate = asyncio.Semaphore(16)
    started = time.monotonic()

    async def create(index: int) -> None:
        async with gate:
            await api.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", _pod(index))

    await asyncio.gather(*(create(i) for i in range(count)))
    created = time.monotonic() - started
    await asyncio.wait_for(done.wait(), timeout=max(120.0, count / 10))
    elapsed = time.monotonic() - started
    watcher.cancel()
    cpu = {
        "fleet": cpu_seconds(fleet_pid) - cpu_before["fleet"],
        "scheduler": cpu_seconds(scheduler_pid) - cpu_before["scheduler"],
        "apiserver": cpu_of(apiserver) - cpu_before["apiserver"],
        "etcd": cpu_of(etcd) - cpu_before["etcd"],
        "bench_client": own_cpu() - cpu_before["bench_client"],
    }
    result = {
        "pods_running": len(running),
        "created_s": round(created, 2),
        "all_running_s": round(elapsed, 2),
        "pods_per_s": round(count / elapsed, 1),
        "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
        "cpu_share_of_wall": {k: round(v / elapsed, 3) for k, v in cpu.items()},
    }
    return result


def bench_fleet_openb(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """openb on the real scheduler with the extender, and the planner's answer."""
    from fleet_trace import run_trace_fleet, subset

    openb = ROOT.parent / "shared" / "data" / "openb"
    nodes = openb / "openb_node_list_gpu_node.csv"
    pods = openb / "openb_pod_list_default.csv"
    if not nodes.is_file():
        return {"skipped": f"openb is not in {openb}"}
    plane = ControlPlane.find(ROOT)
    if plane is None:
        return {"skipped": how_to_provide(ROOT)}
    if args.sample:
        nodes = subset(nodes, args.sample, args.seed, folder / "openb_nodes.csv")
    kubeconfig = plane.start()
    started = time.monotonic()
    try:
        report = run_trace_fleet(
            folder / "run",
            kubeconfig,
            plane.bin_dir,
            nodes,
            pods,
            args.policy,
            args.seed,
            args.inflate,
            progress=True,
        )
    finally:
        plane.stop()
    report["wall_s"] = round(time.monotonic() - started, 1)
    return report


def main() -> int:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, help="default: 10,000; 4,000 with --dra")
    parser.add_argument(
        "--dra",
        action="store_true",
        help="GPUs served through DRA, a claim per pod from a ResourceClaimTemplate",
    )
    parser.add_argument(
        "--scheduler-qps",
        type=int,
        help="the scheduler's client QPS, and with --dra the claim controller's "
        f"(default: their own; {QPS} with --dra; 0: their own)",
    )
    parser.add_argument(
        "--openb",
        action="store_true",
        help="openb's default trace on a fleet of its node list, through the real scheduler "
        "and devplug's extender, beside the planner (bench/fleet_trace.py)",
    )
    parser.add_argument(
        "--policy", default="fgd", help="--openb: the extender's and the planner's policy"
    )
    parser.add_argument("--seed", type=int, default=42, help="--openb: the protocol's seed")
    parser.add_argument(
        "--inflate",
        type=float,
        default=100.0,
        help="--openb: the pods' GPU request, %% of the GPU capacity",
    )
    parser.add_argument(
        "--sample",
        type=int,
        help="--openb: this many nodes of the list, drawn with the seed (default: all)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="devplug-fleet-bench-") as tmp:
        if args.openb:
            report = {"fleet_openb": bench_fleet_openb(Path(tmp), args)}
        elif args.dra:
            qps = QPS if args.scheduler_qps is None else args.scheduler_qps or None
            pods = 4000 if args.pods is None else args.pods
            report = {"fleet_dra": bench_fleet_dra(Path(tmp), args.nodes, pods, qps)}
        else:
            pods = 10_000 if args.pods is None else args.pods
            report = {"fleet": bench_fleet(Path(tmp), args.nodes, pods, args.scheduler_qps)}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
