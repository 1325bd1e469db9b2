"""Placement policies on a production trace: each policy's run of openb's default pod
list (inflated to 130 % of GPU capacity, seed 42: about 10,800 pods) on its 1,213 GPU
nodes, in a process of its own pinned to two CPUs: wall and CPU seconds of the replay,
of the whole process (reading the CSV files, the report), and its peak memory.

Called by bench/run.py (key "placement"); `python bench/placement.py` prints it alone.
Skipped, with the reason, when ../shared/data/openb is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OPENB = REPO.parent / "shared" / "data" / "openb"
NODES = OPENB / "openb_node_list_gpu_node.csv"
PODS = OPENB / "openb_pod_list_default.csv"
POLICIES = ("default", "bestfit", "packing", "fgd")
# per policy, on two otherwise idle cores: process CPU seconds (the wall seconds are the
# same when nothing else runs) and peak memory
TARGETS = {"process_cpu_s": 10.0, "peak_rss_mib": 300.0}

# One run, in the child: timings and peak memory as JSON on stdout.
CHILD = """
import json, os, resource, sys, time
started, cpu_started = time.perf_counter(), time.process_time()
from devplug.placement import MILLI, TargetWorkload
from devplug.plan.replay import arrivals, replay, summary
from devplug.placement.trace import read_nodes, read_pods
nodes, pods = read_nodes(sys.argv[1]), read_pods(sys.argv[2])
order = arrivals(pods, 42, 130, sum(n.gpus for n in nodes) * MILLI)
target = TargetWorkload.of(p.demand for p in pods)
wall, cpu = time.perf_counter(), time.process_time()
run = replay(nodes, order, sys.argv[3], target, 42)
replay_wall, replay_cpu = time.perf_counter() - wall, time.process_time() - cpu
result = summary(run)
print(json.dumps({
    "pods": len(order), "nodes": len(nodes),
    "replay_s": round(replay_wall, 2), "replay_cpu_s": round(replay_cpu, 2),
    "process_s": round(time.perf_counter() - started, 2),
    "process_cpu_s": round(time.process_time() - cpu_started, 2),
    "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    "allocated_percent_at_100": result["at"]["100"]["allocated_percent"],
}))
"""


def _two_cpus() -> None:
    cpus = sorted(os.sched_getaffinity(0))[:2]
    os.sched_setaffinity(0, cpus)


def bench_placement() -> dict[str, Any]:
    if not NODES.exists() or not PODS.exists():
        return {"skipped": f"{OPENB} is missing (cluster-trace-gpu-v2023 csv files)"}
    results: dict[str, Any] = {"trace": str(PODS.name), "targets": TARGETS, "policies": {}}
    for policy in POLICIES:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(NODES), str(PODS), policy],
            capture_output=True,
            text=True,
            check=True,
            preexec_fn=_two_cpus,
        )
        results["policies"][policy] = json.loads(done.stdout)
    return results


def summary(report: dict[str, Any]) -> str:
    if "skipped" in report:
        return "placement skipped"
    return "placement " + ", ".join(
        f"{name} {r['process_cpu_s']} s CPU {r['peak_rss_mib']} MiB"
        for name, r in report["policies"].items()
    )


if __name__ == "__main__":
    result = bench_placement()
    print(json.dumps(result, indent=2))
    print(summary(result), file=sys.stderr)
