"""The scheduler extender's verbs at the size of a production cluster: openb's 1,213 GPU
nodes as Node objects with their published inventories (1 milli-GPU per device), and
its default pod list's GPU pods in arrival order (seed 42) placed one at a time through
`filter`, `prioritize` and `bind`, side by side: `cached`, the verbs reading the cache
as the server does (each change given to it as its watch would deliver it), and
`listed`, each call rebuilding the state from every Node and pod (the extender before
its cache). Milliseconds per call (p50, p95) as the cluster fills, per policy, on one
CPU; the objects are in memory (the API server's own time is not in it).

Called by bench/run.py (key "extender"); `python bench/extender.py` prints it alone.
Skipped, with the reason, when ../shared/data/openb is missing.
"""

from __future__ import annotations

import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OPENB = REPO.parent / "shared" / "data" / "openb"
NODES = OPENB / "openb_node_list_gpu_node.csv"
PODS = OPENB / "openb_pod_list_default.csv"
POLICIES = ("default", "bestfit", "fgd")
PLACED = 200  # GPU pods placed per policy
RESOURCE = "devplug.io/gpu-milli"


class Objects:
    """The API's objects in memory: what `Extender` reads and writes; each change
    delivered to `cache` (when given) as a copy, as its watch would."""

    def __init__(self, nodes: list[dict[str, Any]], cache: Any = None) -> None:
        self._nodes = nodes
        self._pods: dict[str, dict[str, Any]] = {}
        self.cache = cache
        if cache is not None:
            cache.replace("nodes", copy.deepcopy(nodes))
            cache.replace("pods", [])

    def _watched(self, event: str, name: str) -> None:
        if self.cache is not None:
            self.cache.apply("pods", event, copy.deepcopy(self._pods[name]))

    def nodes(self) -> list[dict[str, Any]]:
        return self._nodes

    def pods(self) -> list[dict[str, Any]]:
        return list(self._pods.values())

    def add(self, pod: dict[str, Any]) -> None:
        self._pods[pod["metadata"]["name"]] = pod
        self._watched("ADDED", pod["metadata"]["name"])

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self._pods[name]

    def annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self._pods[name]["metadata"].setdefault("annotations", {}).update(annotations)
        self._watched("MODIFIED", name)

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        self._pods[name]["spec"]["nodeName"] = node
        self._watched("MODIFIED", name)


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))] * 1000, 2),
    }


def run_policy(policy: str, cached: bool) -> tuple[dict[str, Any], list[str]]:
    """The timings, and each pod's node and GPUs (the same whichever way is read)."""
    from devplug.extender.cache import Cache
    from devplug.extender.verbs import Extender
    from devplug.placement import MILLI, TargetWorkload
    from devplug.placement.inventory import Gpu, Inventory
    from devplug.plan.replay import arrivals
    from devplug.plan.trace import read_nodes, read_pods

    nodes, pods = read_nodes(str(NODES)), read_pods(str(PODS))
    # Never started: Objects gives it each change, as its watch would.
    cache = Cache(source=None) if cached else None
    objects = Objects(
        [
            {
                "metadata": {
                    "name": n.name,
                    "annotations": {
                        "devplug.io/gpu-inventory": Inventory(
                            RESOURCE, 1, tuple(Gpu(f"{n.name}-{i}", n.model) for i in range(n.gpus))
                        ).encode()
                    },
                },
                "status": {"allocatable": {"cpu": f"{n.cpu}m", "memory": f"{n.memory}Mi"}},
            }
            for n in nodes
        ],
        cache,
    )
    order = [
        p for p in arrivals(pods, 42, 100, sum(n.gpus for n in nodes) * MILLI) if p.demand.gpus
    ]
    target = TargetWorkload.of(p.demand for p in pods) if policy == "fgd" else None
    extender = Extender(objects, policy, target, cache)
    times: dict[str, list[float]] = {"filter": [], "prioritize": [], "bind": []}
    placed = 0
    choices: list[str] = []
    for index, trace in enumerate(order[:PLACED]):
        demand = trace.demand
        pod = {
            "metadata": {"name": f"p{index}", "uid": f"u{index}", "annotations": {}},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "resources": {
                            "requests": {"cpu": f"{demand.cpu}m", "memory": f"{demand.memory}Mi"},
                            "limits": {RESOURCE: str(demand.total_milli)},
                        },
                    }
                ]
            },
        }
        objects.add(pod)
        args = {"Pod": pod, "Nodes": {"items": objects.nodes()}}
        started = time.perf_counter()
        kept = extender.filter(args)
        times["filter"].append(time.perf_counter() - started)
        if not kept["Nodes"]["items"]:
            continue
        args = {"Pod": pod, "Nodes": kept["Nodes"]}
        started = time.perf_counter()
        scores = extender.prioritize(args)
        times["prioritize"].append(time.perf_counter() - started)
        best = max(scores, key=lambda s: s["Score"])["Host"]
        started = time.perf_counter()
        answer = extender.bind(
            {"PodName": f"p{index}", "PodNamespace": "n", "PodUID": f"u{index}", "Node": best}
        )
        times["bind"].append(time.perf_counter() - started)
        placed += not answer["Error"]
        notes = objects.pod("n", f"p{index}")["metadata"]["annotations"]
        choices.append(f"{best} {notes.get('devplug.io/gpu-assigned', '')}")
    return {"pods": min(PLACED, len(order)), "placed": placed, "nodes": len(nodes)} | {
        verb: _percentiles(values) for verb, values in times.items() if values
    }, choices


def bench_extender() -> dict[str, Any]:
    if not NODES.exists() or not PODS.exists():
        return {"skipped": f"{OPENB} is missing (cluster-trace-gpu-v2023 csv files)"}
    policies: dict[str, Any] = {}
    for policy in POLICIES:
        cached, cached_choices = run_policy(policy, True)
        listed, listed_choices = run_policy(policy, False)
        policies[policy] = {
            "cached": cached,
            "listed": listed,
            "same_choices": cached_choices == listed_choices,
        }
    return {"policies": policies}


def summary(report: dict[str, Any]) -> str:
    if "skipped" in report:
        return "extender skipped"
    return "extender on 1,213 nodes p50 cached (listed) " + ", ".join(
        f"{name} "
        + " ".join(
            f"{verb} {ways['cached'][verb]['p50_ms']} ({ways['listed'][verb]['p50_ms']}) ms"
            for verb in ("filter", "prioritize", "bind")
        )
        + ("" if ways["same_choices"] else " (CHOICES DIFFER)")
        for name, ways in report["policies"].items()
    )


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    result = bench_extender()
    print(json.dumps(result, indent=2))
    print(summary(result), file=sys.stderr)
