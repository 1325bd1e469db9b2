"""`devplug fleet` serving GPUs through DRA, against the real kube-apiserver, etcd,
kube-scheduler and the resourceclaim controller of kube-controller-manager: every node
publishes a ResourceSlice of its 8 GPUs, each pod asks for one through a claim made
from a ResourceClaimTemplate, the real scheduler allocates the claim and binds the pod,
the node prepares the claim and reports the pod Running.

Reported: pods per second from creation to Running, the time each pod spent in each
step (claim made, allocated and bound, Running), the scheduler's and the claim
controller's own metrics beside them (attempts, durations, the DynamicResources
plugin's evaluations, the time their API clients waited on their own rate limiters),
and the CPU each process spent (the fleet beside the API server, etcd, the scheduler
and the controller manager, from /proc).

`make fleet-bench-dra` runs it at 1,000 nodes (`python bench/fleet.py --dra --nodes 1000
--pods 4000`). Skipped, with the reason, where the control-plane binaries are absent.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import cpu_of, machine_cpu, own_cpu, pids_with

from devplug.testing.components import (
    Component,
    claim_controller_summary,
    client_summary,
    controller_manager_binary,
    parse_metrics,
    scheduler_summary,
)
from devplug.testing.controlplane import ControlPlane, how_to_provide

ROOT = Path(__file__).resolve().parent.parent
SCHEDULER = "devplug-bench-dra"
DRIVER = "gpu.devplug.io"
TEMPLATE = "one-gpu"
GPUS_PER_NODE = 8
NAMESPACE = "default"
# The scheduler's and the claim controller's client rate. Their defaults (50 QPS, burst
# 100; the controller manager's 20, burst 30) cap what they can write: a DRA pod costs the
# scheduler two writes (the claim's allocation, the binding) and the controller two (the
# claim, the pod's claim status), so 25 and 10 pods/s at most. 1,000 (burst 2,000) is
# above what one API server on this machine answers, so the limiters never bind: the
# rate measured is the machine's. Their metrics say how long the clients waited anyway.
QPS = 1000
CREATE_CONCURRENCY = 16


def bench_fleet_dra(
    root: Path, nodes: int = 100, pods: int = 400, qps: int | None = QPS
) -> dict[str, Any]:
    plane = ControlPlane.find(ROOT)
    if plane is None:
        return {"skipped": how_to_provide(ROOT)}
    manager = controller_manager_binary(ROOT, plane.bin_dir)
    if manager is None:
        return {"skipped": how_to_provide(ROOT) + " (and kube-controller-manager.xz beside them)"}
    if pods > nodes * GPUS_PER_NODE:
        raise SystemExit(f"--pods {pods}: {nodes} nodes have {nodes * GPUS_PER_NODE} GPUs")
    kubeconfig = plane.start()
    try:
        return _bench(root / "fleet-dra", kubeconfig, plane.bin_dir, manager, nodes, pods, qps)
    finally:
        plane.stop()


def fleet_file(folder: Path, nodes: int, name: str = "benchdra", driver: str = DRIVER) -> Path:
    path = folder / "fleet-dra.yaml"
    path.write_text(
        f"""name: {name}
pools:
  - name: gpu
    count: {nodes}
    namePrefix: {name}-
    cpu: 64
    memory: 512Gi
    gpus: {{model: H100-SXM5-80GB, count: {GPUS_PER_NODE}}}
    config:
      resources:
        - nvidia: {{}}
          mode: dra
          dra: {{driver: {driver}}}
"""
    )
    return path


def device_class(driver: str = DRIVER) -> dict[str, Any]:
    selector = {"cel": {"expression": f'device.driver == "{driver}"'}}
    return {"metadata": {"name": driver}, "spec": {"selectors": [selector]}}


def claim_template(driver: str = DRIVER, name: str = TEMPLATE) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": driver}}
    return {"metadata": {"name": name}, "spec": {"spec": {"devices": {"requests": [request]}}}}


def dra_pod(name: str, scheduler: str = SCHEDULER, template: str = TEMPLATE) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/bench:1",
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "128Mi"},
                        "claims": [{"name": "gpu"}],
                    },
                }
            ],
        },
    }


def _bench(
    folder: Path,
    kubeconfig: str,
    bin_dir: Path,
    manager: Path,
    nodes: int,
    pods: int,
    qps: int | None,
) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    plane_dir = str(Path(kubeconfig).parent)
    burst = qps * 2 if qps else None
    report: dict[str, Any] = {
        "nodes": nodes,
        "gpus_per_node": GPUS_PER_NODE,
        "pods": pods,
        "client_qps": {"scheduler": qps or "default", "controller_manager": qps or "default"},
        "client_burst": {"scheduler": burst or "default", "controller_manager": burst or "default"},
    }
    scheduler = Component.scheduler(folder, kubeconfig, bin_dir, SCHEDULER, qps, burst)
    claims = Component.claim_controller(folder, manager, kubeconfig, qps, burst)
    fleet_path = fleet_file(folder, nodes)
    command = [sys.executable, "-m", "devplug.cli.main", "--log-level", "warning", "fleet", "up"]
    command += ["-f", str(fleet_path), "--kubeconfig", kubeconfig, "-o", "json"]
    fleet = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    out = ""
    try:
        scheduler.wait_ready()
        claims.wait_ready()
        assert fleet.stdout is not None
        ready = json.loads(fleet.stdout.readline())
        report["fleet_register_s"] = ready["register_s"]
        report["rss_mib"] = ready["rss_mib"]
        processes = {
            "fleet": [fleet.pid],
            "scheduler": [scheduler.pid],
            "controller_manager": [claims.pid],
            "apiserver": pids_with(f"--cert-dir={plane_dir}/certs"),
            "etcd": pids_with(f"--data-dir={plane_dir}/etcd"),
        }
        report.update(asyncio.run(_run(kubeconfig, nodes, pods, processes)))
        sched = parse_metrics(scheduler.metrics())
        kcm = parse_metrics(claims.metrics())
        report["scheduler_metrics"] = scheduler_summary(sched, SCHEDULER)
        report["scheduler_client"] = client_summary(sched)
        report["claim_controller_metrics"] = claim_controller_summary(kcm)
        report["claim_controller_client"] = client_summary(kcm)
    finally:
        fleet.send_signal(signal.SIGTERM)
        out, _ = fleet.communicate(timeout=120)
        claims.stop()
        scheduler.stop()
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    stopped = next((line for line in lines if line.get("event") == "stopped"), {})
    report["fleet_counters"] = {
        k: stopped.get(k)
        for k in (
            "admitted",
            "claims_prepared",
            "claim_reads_s",
            "admit_s",
            "rejected",
            "waiting",
            "status_writes",
            "api_calls",
        )
    }
    return report


async def _run(
    kubeconfig: str, nodes: int, pods: int, processes: dict[str, list[int]]
) -> dict[str, Any]:
    from devplug.apiserver.client import KubeApi

    async with KubeApi.from_kubeconfig(kubeconfig, concurrency=CREATE_CONCURRENCY) as api:
        await api.call("POST", "/apis/resource.k8s.io/v1/deviceclasses", device_class())
        await api.call(
            "POST",
            f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates",
            claim_template(),
        )
        started = time.monotonic()
        slices = await published_slices(api, DRIVER, nodes)
        result: dict[str, Any] = {
            "slices": len(slices),
            "slices_s": round(time.monotonic() - started, 2),
        }
        bound: dict[str, str] = {}
        result["end_to_end"] = await pods_through(api, pods, processes, bound)
        result["allocation"] = await allocation_check(api, slices, bound)
        return result


async def published_slices(api: Any, driver: str, nodes: int) -> dict[str, dict[str, Any]]:
    """The driver's ResourceSlices by name, once `nodes` nodes have published one."""
    import msgspec

    path = "/apis/resource.k8s.io/v1/resourceslices"
    params = {"fieldSelector": f"spec.driver={driver}"}
    listed = await api.call("GET", path, params=params)
    found = {s["metadata"]["name"]: s for s in listed["items"]}
    version = listed["metadata"]["resourceVersion"]

    def covered() -> int:
        return len({s["spec"].get("nodeName") for s in found.values()})

    while covered() < nodes:
        async for line in api.watch(path, {**params, "resourceVersion": version}, 300):
            event = msgspec.json.decode(line)
            obj = event.get("object") or {}
            version = obj.get("metadata", {}).get("resourceVersion", version)
            if event.get("type") in ("ADDED", "MODIFIED"):
                found[obj["metadata"]["name"]] = obj
            if covered() >= nodes:
                break
    return found


async def pods_through(
    api: Any, count: int, processes: dict[str, list[int]], bound: dict[str, str]
) -> dict[str, Any]:
    """Create `count` DRA pods and follow each (watched) through its steps: its claim
    made (the pod's claim status), bound, Running; with the CPU each process spent.
    `bound` gets each pod's node."""
    import msgspec

    seen: dict[str, dict[str, float]] = {}
    done = asyncio.Event()
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    listed = await api.call("GET", path, params={"limit": "1"})
    version = listed["metadata"]["resourceVersion"]

    def note(obj: dict[str, Any], now: float) -> None:
        steps = seen.setdefault(obj["metadata"]["name"], {})
        status = obj.get("status") or {}
        if status.get("resourceClaimStatuses"):
            steps.setdefault("claim", now)
        if node := (obj.get("spec") or {}).get("nodeName"):
            steps.setdefault("bound", now)
            bound[obj["metadata"]["name"]] = node
        if status.get("phase") == "Running" and "running" not in steps:
            steps["running"] = now
            if sum("running" in s for s in seen.values()) >= count:
                done.set()

    async def watch() -> None:
        nonlocal version
        while not done.is_set():
            params = {"resourceVersion": version, "allowWatchBookmarks": "true"}
            async for line in api.watch(path, params, 300):
                event = msgspec.json.decode(line)
                obj = event.get("object") or {}
                version = obj.get("metadata", {}).get("resourceVersion", version)
                if event.get("type") in ("ADDED", "MODIFIED"):
                    note(obj, time.monotonic())
                if done.is_set():
                    return

    before = {k: cpu_of(v) for k, v in processes.items()}
    before["bench_client"] = own_cpu()
    machine_before = machine_cpu()
    watcher = asyncio.create_task(watch())
    gate = asyncio.Semaphore(CREATE_CONCURRENCY)
    created: dict[str, float] = {}
    started = time.monotonic()

    async def create(index: int) -> None:
        name = f"dra-{index}"
        async with gate:
            created[name] = time.monotonic()
            await api.call("POST", path, dra_pod(name))

    await asyncio.gather(*(create(i) for i in range(count)))
    created_s = time.monotonic() - started
    try:
        await asyncio.wait_for(done.wait(), timeout=max(300.0, count / 5))
    finally:
        watcher.cancel()
    elapsed = time.monotonic() - started
    cpu = {k: cpu_of(v) - before[k] for k, v in processes.items()}
    cpu["bench_client"] = own_cpu() - before["bench_client"]
    (busy_now, total_now), (busy_then, total_then) = machine_cpu(), machine_before
    busy, total = busy_now - busy_then, total_now - total_then
    control_plane = sum(v for k, v in cpu.items() if k not in ("fleet", "bench_client"))
    created_at = {name: {"created": at} for name, at in created.items()}
    stamps = {name: {**created_at.get(name, {}), **steps} for name, steps in seen.items()}

    def between(first: str, then: str) -> list[float]:
        return [s[then] - s[first] for s in stamps.values() if first in s and then in s]

    def rate(step: str) -> float:
        """Pods per second through one step, from its first pod to its last."""
        times = [s[step] for s in stamps.values() if step in s]
        return round(len(times) / max(max(times) - min(times), 1e-9), 1) if times else 0.0

    steps = {
        "claim_made": between("created", "claim"),
        "claim_to_bound": between("claim", "bound"),
        "bound_to_running": between("bound", "running"),
        "created_to_running": between("created", "running"),
    }
    return {
        "pods_running": sum("running" in s for s in seen.values()),
        "created_s": round(created_s, 2),
        "all_running_s": round(elapsed, 2),
        "pods_per_s": round(count / elapsed, 1),
        "step_s": {k: _spread(v) for k, v in steps.items()},
        "step_pods_per_s": {k: rate(k) for k in ("created", "claim", "bound", "running")},
        "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
        "cpu_share_of_wall": {k: round(v / elapsed, 3) for k, v in cpu.items()},
        "cpu_ms_per_pod": {k: round(v / count * 1000, 1) for k, v in cpu.items()},
        "fleet_share_of_cpu": round(cpu["fleet"] / max(cpu["fleet"] + control_plane, 1e-9), 3),
        # The whole machine's CPU over the run (/proc/stat): busy, and the share of it
        # that these processes used (the rest is everything else the machine ran).
        "machine_cpu_busy": round(busy / max(total, 1e-9), 3),
        "ours_of_machine_busy": round(
            sum(cpu.values()) * os.sysconf("SC_CLK_TCK") / max(busy, 1e-9), 3
        ),
    }


def _spread(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    if not ordered:
        return {"n": 0}

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"p50": pick(0.5), "p90": pick(0.9), "max": pick(1.0), "n": len(ordered)}


async def allocation_check(
    api: Any, slices: dict[str, dict[str, Any]], bound: dict[str, str]
) -> dict[str, Any]:
    """Every claim of the namespace: allocated, to a device that the node its pod is
    bound to published (`bound`: pod name -> node), no device twice."""
    listed = await api.call(
        "GET", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
    )
    published = {
        (found["spec"]["nodeName"], found["spec"]["pool"]["name"], device["name"])
        for found in slices.values()
        for device in found["spec"].get("devices") or []
    }
    allocated = []
    for claim in listed["items"]:
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        nodes = {bound.get(r.get("name", "")) for r in status.get("reservedFor") or []}
        allocated += [(node, r["pool"], r["device"]) for r in results for node in nodes]
    return {
        "claims": len(listed["items"]),
        "allocated": len(allocated),
        "distinct_devices": len({(pool, device) for _, pool, device in allocated}),
        "published_devices": len(published),
        "not_on_the_pods_node": len([a for a in allocated if a not in published]),
    }
