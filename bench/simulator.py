"""The simulator's admission against the kubelet's own device manager, side by side.

The same work for both: 1,000 one-device pods (one container `ctr`, UIDs as the
harness gives them) admitted one after the other on the 1,000 virtual devices of one
`devplug serve`, a checkpoint written per allocation. The kubelet's side is the real
pkg/kubelet/cm/devicemanager behind `dpharness` (devplug.testing.dpharness); the
simulator's is `Kubelet.apply`, one pod per call. Rounds alternate which goes first;
the report gives each run and the medians. Rates count the pods between the first
admission and the last; per-pod costs are the medians of the gaps between consecutive
admissions over the first and the last 100 pods.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from common import serve_command

from devplug.testing import dpharness

RESOURCE = "bench.devplug.io/admit"
DEVICES = 1000
ROUNDS = 3
EDGE = 100  # pods at the start and at the end whose cost is reported


def _rates(times: list[float]) -> dict[str, Any]:
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return {
        "pods": len(times),
        "pods_per_s": round((len(times) - 1) / (times[-1] - times[0])),
        "first_100_ms": round(statistics.median(gaps[:EDGE]) * 1000, 2),
        "last_100_ms": round(statistics.median(gaps[-EDGE:]) * 1000, 2),
    }


def _pod(index: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"pod-{index}", "uid": dpharness.pod_uid(index)},
        "spec": {
            "containers": [{"name": dpharness.CONTAINER, "resources": {"limits": {RESOURCE: 1}}}]
        },
    }


async def _simulator_run(root: Path, config: Path) -> dict[str, Any]:
    from devplug.simulator import Kubelet

    plugin_dir = root / "plugins"
    proc = await asyncio.create_subprocess_exec(*serve_command(config, plugin_dir))
    try:
        async with Kubelet(plugin_dir, root / "state", control_socket=False) as kubelet:
            await kubelet.wait_for_resource(RESOURCE, count=DEVICES, timeout=60)
            pods = [_pod(i) for i in range(DEVICES)]
            times = []
            admitted = 0
            for pod in pods:
                [result] = await kubelet.apply(pod)
                times.append(time.perf_counter())
                admitted += result.admitted
            [full] = await kubelet.apply(_pod(DEVICES))
            started = time.perf_counter()
            for i in range(DEVICES):
                await kubelet.delete_pod(f"pod-{i}")
            deleted = time.perf_counter() - started
    finally:
        proc.terminate()
        await proc.wait()
    return _rates(times) | {
        "admitted": admitted,
        "extra_pod_rejected": not full.admitted,
        "deletes_per_s": round(DEVICES / deleted),
    }


def _kubelet_run(binary: Path, root: Path, config: Path) -> dict[str, Any]:
    run = dpharness.admit(
        binary,
        root / "kubelet",
        RESOURCE,
        lambda folder: serve_command(config, folder),
        pods=DEVICES,
        min_capacity=DEVICES,
    )
    times = [t for t, _ in run.allocations]
    summary = run.last("summary") or {}
    if run.returncode != 0 or len(times) < 2:
        raise RuntimeError(f"dpharness exited {run.returncode}: {run.log[-2000:]}")
    return _rates(times) | {"admitted": summary.get("admitted")}


def bench_admission(root: Path, repo: Path) -> dict[str, Any]:
    """Both sides, ROUNDS times; medians and their ratio."""
    config = root / "admission.yaml"
    config.write_text(f"resources:\n  - name: {RESOURCE}\n    virtual: {DEVICES}\n")
    binary = dpharness.find(repo)
    runs: dict[str, list[dict[str, Any]]] = {"simulator": [], "kubelet": []}
    # The pod one too many is rejected on purpose: no warning for it.
    logging.getLogger("devplug.simulator").setLevel(logging.ERROR)
    for round_ in range(ROUNDS):
        sides = ["kubelet", "simulator"] if round_ % 2 == 0 else ["simulator", "kubelet"]
        for side in sides:
            folder = root / f"admission-{side}-{round_}"
            if side == "simulator":
                runs[side].append(asyncio.run(_simulator_run(folder, config)))
            elif binary is not None:
                runs[side].append(_kubelet_run(binary, folder, config))
            shutil.rmtree(folder, ignore_errors=True)
    report: dict[str, Any] = {"devices": DEVICES, "pods": DEVICES, "rounds": ROUNDS}
    for side, results in runs.items():
        if not results:
            report[side] = {"skipped": dpharness.how_to_provide(repo)}
            continue
        report[side] = {
            key: statistics.median(r[key] for r in results)
            for key in ("pods_per_s", "first_100_ms", "last_100_ms", "deletes_per_s")
            if key in results[0]
        } | {"runs": results}
    if runs["kubelet"]:
        report["ratio"] = round(
            report["simulator"]["pods_per_s"] / report["kubelet"]["pods_per_s"], 2
        )
        report["ratio_per_round"] = [
            round(s["pods_per_s"] / k["pods_per_s"], 2)
            for s, k in zip(runs["simulator"], runs["kubelet"], strict=True)
        ]
    else:
        report["ratio"] = None
        report["ratio_skipped"] = dpharness.how_to_provide(repo)
    return report


def summary(report: dict[str, Any]) -> str:
    sim = report["simulator"]
    text = f"sim {sim['pods_per_s']} pods/s ({sim['first_100_ms']} -> {sim['last_100_ms']} ms/pod)"
    real = report["kubelet"]
    if "skipped" in real:
        return text + f", ratio skipped: {real['skipped']}"
    return text + (
        f", kubelet {real['pods_per_s']} pods/s ({real['first_100_ms']} -> "
        f"{real['last_100_ms']} ms/pod), x{report['ratio']}"
    )
