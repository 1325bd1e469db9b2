"""A cluster trace's pods through the real kube-scheduler and devplug's extender, on a
fleet built from the trace's node list, beside the planner's answer for the same
inputs: openb under the paper's protocol (docs/fleet.md, "openb on the real scheduler").

The fleet (`devplug fleet up -f NODES.csv`: every node of the list registered with the
API server, publishing its GPU inventory), the extender (`devplug extender --policy P
--workload PODS.csv`) and a kube-scheduler whose profile calls it (deploy/extender's
shape; every pod through the extender, all nodes scored) are real processes. The pods
arrive as the planner has them (`devplug.plan.replay.arrivals`: sorted, shuffled with
the seed, inflated to the share of GPU capacity, arrivals only), one at a time: each is
created once the one before is unschedulable, or bound and admitted by its node, so that
both place the same pod on the same state. Allocation: the GPU capacity the bound pods
ask for (a share counts as its share), as the planner counts it.

`make fleet-bench` runs it on openb's 1,213 nodes (`python bench/fleet.py --openb`); the
test `tests/controlplane/test_fleet_trace.py` on 100 of them.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from devplug.extender.state import MODELS
from devplug.fleet.nodelist import RESOURCE, unit
from devplug.placement import MILLI, Node, Placer, TargetWorkload, make_policy
from devplug.placement.trace import TracePod, read_nodes, read_pods
from devplug.plan.replay import arrivals, replay
from devplug.testing.components import Component

SCHEDULER = "devplug-trace"
NAMESPACE = "default"
RUN_LABEL = "devplug.io/trace-run"
SHIPPED = Path(__file__).resolve().parents[1] / "deploy" / "extender" / "scheduler.yaml"


def scheduler_settings(url: str) -> dict[str, Any]:
    """deploy/extender/scheduler.yaml's extender and node share, as shipped, calling
    `url`, for every pod (no managedResources): pods without GPUs are placed by the
    policy too, as the planner does."""
    import yaml

    shipped = yaml.safe_load(SHIPPED.read_text())
    [extender] = shipped["extenders"]
    extender = {k: v for k, v in extender.items() if k != "managedResources"}
    extender["urlPrefix"] = url
    return {
        "percentageOfNodesToScore": shipped["percentageOfNodesToScore"],
        "extenders": [extender],
    }


def subset(nodes_csv: Path, count: int, seed: int, out: Path) -> Path:
    """`count` rows of a node list drawn with `seed`, in the list's order, as a CSV."""
    lines = nodes_csv.read_text().splitlines()
    header, rows = lines[0], lines[1:]
    picked = sorted(random.Random(seed).sample(range(len(rows)), count))
    out.write_text("\n".join([header, *(rows[i] for i in picked)]) + "\n")
    return out


def planned(
    nodes: Sequence[Node], order: Sequence[TracePod], policy: str, target: TargetWorkload
) -> tuple[float, list[str | None]]:
    """The planner's allocation (% of GPU capacity) at the end of `order`, and the node
    each pod got (None: pending)."""
    run = replay(nodes, order, policy, target)
    cluster = [Node(n.name, n.cpu, n.memory, n.model, list(n.gpu_free)) for n in nodes]
    placer = Placer(cluster, make_policy(policy, cluster, target))
    where = []
    for pod in order:
        choice = placer.place(pod.demand)
        where.append(cluster[choice.node].name if choice else None)
    return 100 * run.allocated[-1] / run.capacity_milli, where


def pod_body(pod: TracePod, fleet: str, run: str) -> dict[str, Any]:
    demand = pod.demand
    requests: dict[str, str] = {}
    if demand.cpu:
        requests["cpu"] = f"{demand.cpu}m"
    if demand.memory:
        requests["memory"] = f"{demand.memory}Mi"
    limits = {RESOURCE: str(demand.total_milli // unit())} if demand.gpus else {}
    meta: dict[str, Any] = {"name": pod.name, "namespace": NAMESPACE, "labels": {RUN_LABEL: run}}
    if demand.models:
        meta["annotations"] = {MODELS: ",".join(sorted(demand.models))}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "schedulerName": SCHEDULER,
            "nodeSelector": {"devplug.io/fleet": fleet},
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/trace:1",
                    "resources": {"requests": requests, "limits": limits},
                }
            ],
        },
    }


def _outcome(obj: dict[str, Any]) -> str | None:
    """The node a pod is bound to once its node admitted or rejected it, '' when the
    scheduler found it unschedulable, None while neither."""
    node = (obj.get("spec") or {}).get("nodeName")
    if node:
        phase = (obj.get("status") or {}).get("phase")
        return str(node) if phase in ("Running", "Failed") else None
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return ""
    return None


async def _arrive(
    kubeconfig: str,
    order: Sequence[TracePod],
    fleet: str,
    run: str,
    wait_s: float,
    latencies: list[float],
    progress: bool = False,
) -> list[str]:
    """Create the pods one at a time, each once the one before is decided; where each
    went ('' for pending)."""
    import msgspec

    from devplug.apiserver.client import KubeApi

    decided: dict[str, str] = {}
    changed = asyncio.Event()
    pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
    async with KubeApi.from_kubeconfig(kubeconfig, concurrency=4) as api:
        listed = await api.call("GET", pods, params={"limit": "1"})
        version = listed["metadata"]["resourceVersion"]

        async def watch() -> None:
            nonlocal version
            while True:
                params = {"resourceVersion": version, "labelSelector": f"{RUN_LABEL}={run}"}
                async for line in api.watch(pods, params, 300):
                    event = msgspec.json.decode(line)
                    obj = event.get("object") or {}
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    where = _outcome(obj)
                    if where is not None:
                        decided.setdefault(obj["metadata"]["name"], where)
                        changed.set()

        watcher = asyncio.create_task(watch())
        where: list[str] = []
        try:
            for pod in order:
                began = time.monotonic()
                await api.call("POST", pods, pod_body(pod, fleet, run))
                async with asyncio.timeout(wait_s):
                    while pod.name not in decided:
                        changed.clear()
                        if watcher.done():
                            watcher.result()
                        await changed.wait()
                where.append(decided[pod.name])
                latencies.append(time.monotonic() - began)
                if progress and len(where) % 100 == 0:
                    print(f"{len(where)} of {len(order)} pods decided", file=sys.stderr)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    return where


async def _delete_pods(kubeconfig: str, run: str) -> None:
    """The run's pods, once the scheduler is stopped (deleting frees room, and a pending
    pod would then be placed)."""
    from devplug.apiserver.client import KubeApi

    async with KubeApi.from_kubeconfig(kubeconfig) as api:
        # One request for thousands of pods: the API server answers once all are gone.
        await api.call(
            "DELETE",
            f"/api/v1/namespaces/{NAMESPACE}/pods",
            params={"labelSelector": f"{RUN_LABEL}={run}", "gracePeriodSeconds": "0"},
            timeout=900,
        )


def _devplug(*args: str) -> list[str]:
    return [sys.executable, "-m", "devplug.cli.main", "--log-level", "warning", *args]


def run_trace_fleet(
    folder: Path,
    kubeconfig: str,
    bin_dir: Path,
    nodes_csv: Path,
    pods_csv: Path,
    policy: str,
    seed: int = 42,
    inflate_percent: float = 100.0,
    progress: bool = False,
) -> dict[str, Any]:
    """The fleet's allocation and the planner's on the same inputs, as JSON."""
    folder.mkdir(parents=True, exist_ok=True)
    nodes = read_nodes(str(nodes_csv))
    pods = read_pods(str(pods_csv))
    capacity = sum(n.gpus for n in nodes) * MILLI
    order = arrivals(pods, seed, inflate_percent, capacity)
    target = TargetWorkload.of(p.demand for p in pods)
    started = time.monotonic()
    plan_percent, plan_where = planned(nodes, order, policy, target)
    plan_s = time.monotonic() - started
    fleet_name = nodes_csv.stem.lower().replace("_", "-")
    run = f"{policy}-{seed}"
    started = time.monotonic()
    fleet = subprocess.Popen(
        _devplug("fleet", "up", "-f", str(nodes_csv), "--kubeconfig", kubeconfig, "-o", "json",
                 "--status-seconds", "3600"),
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    extender = subprocess.Popen(
        _devplug("extender", "--policy", policy, "--port", "0", "--workload", str(pods_csv),
                 "--kubeconfig", kubeconfig),
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    scheduler = None
    try:
        assert extender.stdout is not None
        assert fleet.stdout is not None
        url = extender.stdout.readline().strip()
        if not url:
            raise RuntimeError("devplug extender did not start")
        settings = scheduler_settings(url)
        scheduler = Component.scheduler(folder, kubeconfig, bin_dir, SCHEDULER, settings=settings)
        ready_line = fleet.stdout.readline()
        if not ready_line:
            raise RuntimeError("devplug fleet up did not start")
        ready = json.loads(ready_line)
        scheduler.wait_ready()
        setup_s = time.monotonic() - started
        ready_fleet = ready.get("fleet", fleet_name)
        started = time.monotonic()
        latencies: list[float] = []
        where = asyncio.run(
            _arrive(kubeconfig, order, ready_fleet, run, 120.0, latencies, progress)
        )
        placed_s = time.monotonic() - started
    finally:
        if scheduler is not None:
            scheduler.stop()
        extender.terminate()
        extender.wait(timeout=30)
        fleet.terminate()
        out, _ = fleet.communicate(timeout=60)
        try:
            asyncio.run(_delete_pods(kubeconfig, run))
        except Exception as error:  # the placement is measured; the cleanup is not
            print(f"the run's pods were not deleted: {error}", file=sys.stderr)
        subprocess.run(
            _devplug("fleet", "down", "-f", str(nodes_csv), "--kubeconfig", kubeconfig),
            capture_output=True,
            check=False,
        )
    stopped = next(
        (r for r in map(json.loads, filter(None, out.splitlines())) if r.get("event") == "stopped"),
        {},
    )
    allocated = sum(p.demand.total_milli for p, node in zip(order, where, strict=True) if node)
    fleet_percent = 100 * allocated / capacity
    differ = [i for i, (a, b) in enumerate(zip(where, plan_where, strict=True)) if (a or None) != b]
    return {
        "policy": policy,
        "seed": seed,
        "nodes": len(nodes),
        "gpus": capacity // MILLI,
        "pods": len(order),
        "inflate_percent": inflate_percent,
        "fleet_allocated_percent": round(fleet_percent, 2),
        "planner_allocated_percent": round(plan_percent, 2),
        "difference_points": round(fleet_percent - plan_percent, 2),
        "fleet_placed": sum(1 for w in where if w),
        "planner_placed": sum(1 for w in plan_where if w),
        "pods_on_another_node": len(differ),
        "first_other_node": (
            {
                "index": differ[0],
                "pod": order[differ[0]].name,
                "fleet": where[differ[0]],
                "planner": plan_where[differ[0]],
            }
            if differ
            else None
        ),
        "fleet_admitted": stopped.get("admitted"),
        "fleet_rejected": stopped.get("rejected"),
        "setup_s": round(setup_s, 2),
        "placed_s": round(placed_s, 2),
        "pods_per_s": round(len(order) / placed_s, 1) if placed_s else None,
        "planner_s": round(plan_s, 2),
        "pod_ms": _quantiles(latencies),
    }


def _quantiles(seconds: list[float]) -> dict[str, float]:
    """p50, p95 and max of the time from a pod's creation to its decision, in ms."""
    ranked = sorted(seconds)
    if not ranked:
        return {}
    at = lambda q: round(1000 * ranked[min(len(ranked) - 1, int(q * len(ranked)))], 1)  # noqa: E731
    return {"p50": at(0.5), "p95": at(0.95), "max": round(1000 * ranked[-1], 1)}
