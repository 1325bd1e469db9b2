"""devplug on a real node (node.sh: the real kubelet v1.36.2, containerd, runc): the
image of `make image` deployed with `kubectl apply -k deploy/`, then timed as the node
sees it. From the kubelet's start (its process start time) to the kubelet dialling
back the last resource (its own log), and to the API showing the node's allocatable
whole again; from the plugin pod's deletion to the same two.

Skipped, with the reason, where the node cannot run (root, binaries, packages).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

from devplug.testing.realnode import MachineLock, RealNode, missing

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "devplug-system"
RESTARTS = 10  # per signal
POD_DELETIONS = 3
RESOURCES = {
    "devplug.io/null": 4,
    "devplug.io/zero": 1,
    "devplug.io/fake": 8,
    "devplug.io/shared": 4,
}


def bench_real_node() -> dict[str, Any]:
    why = missing(ROOT)
    if why is not None:
        return {"skipped": why}
    node = RealNode.find(ROOT)
    assert node is not None
    lock = MachineLock(node_sh=node.script)
    lock.acquire(say=lambda message: print(f"real node: {message}", file=sys.stderr))
    try:
        node.up()
        try:
            node.import_image(ROOT / "build" / "devplug-image.tar")
            with node.deployed(ROOT / "deploy", NAMESPACE, "devplug"):
                report: dict[str, Any] = {"kubelet": node.node()["status"]["nodeInfo"]}
                report["kubelet"] = {
                    k: report["kubelet"][k] for k in ("kubeletVersion", "containerRuntimeVersion")
                }
                for kill in (False, True):
                    key = "kubelet_sigkill" if kill else "kubelet_sigterm"
                    report[key] = _restarts(node, kill)
                report["plugin_pod_deleted"] = _pod_deletions(node)
            return report
        finally:
            node.down()
    finally:
        lock.release()


def _summary(samples: list[dict[str, float]], rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {"rounds": rounds}
    for key in ("registered_s", "allocatable_back_s"):
        values = [s[key] for s in samples]
        out[key] = {
            "median": round(statistics.median(values), 3),
            "max": round(max(values), 3),
        }
    out["allocatable_dropped"] = sum(bool(s["dropped"]) for s in samples)
    return out


def _restarts(node: RealNode, kill: bool) -> dict[str, Any]:
    names = list(RESOURCES)
    samples = []
    extra_registrations = 0
    for _ in range(RESTARTS):
        with node.node_history() as history:
            start = node.restart_kubelet(kill=kill)
            registered = node.wait_connected(names, start)
            back, dropped = history.allocatable_back(RESOURCES, start.started, registered)
        requests = node.registrations(start)
        extra_registrations += sum(len(requests.get(r, [])) - 1 for r in names)
        samples.append(
            {
                "registered_s": registered - start.started,
                "allocatable_back_s": back - start.started,
                "dropped": dropped,
            }
        )
    return _summary(samples, RESTARTS) | {"extra_registrations": extra_registrations}


def _pod_deletions(node: RealNode) -> dict[str, Any]:
    names = list(RESOURCES)
    samples = []
    for _ in range(POD_DELETIONS):
        [old] = node.daemon_pods(NAMESPACE, "devplug")
        offset = node.log_offset()
        with node.node_history() as history:
            deleted = time.time()
            node.kubectl("delete", "pod", "-n", NAMESPACE, old["metadata"]["name"], timeout=120)
            registered = node.wait_connected(names, offset, timeout=120)
            back, dropped = history.allocatable_back(RESOURCES, deleted, registered)
        node.rolled_out(NAMESPACE, "devplug")
        samples.append(
            {
                "registered_s": registered - deleted,
                "allocatable_back_s": back - deleted,
                "dropped": dropped,
            }
        )
    return _summary(samples, POD_DELETIONS)
