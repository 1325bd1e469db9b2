"""The API objects a simulated node writes, in the shapes a kubelet writes them: its
Node (capacity, allocatable, conditions), its Lease, pod statuses and Events."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from devplug.fleet.spec import Pool

FLEET_LABEL = "devplug.io/fleet"
POOL_LABEL = "devplug.io/fleet-pool"
LEASE_NAMESPACE = "kube-node-lease"
# What a kubelet reports as its version; a stand-in says it is one.
KUBELET_VERSION = "v1.36.2-devplug-fleet"


def now() -> str:
    """A Kubernetes Time (RFC 3339, seconds)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    """A Kubernetes MicroTime (a Lease's renewTime)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def fleet_labels(fleet: str, pool: str) -> dict[str, str]:
    return {FLEET_LABEL: fleet, POOL_LABEL: pool}


def conditions(heartbeat: str, transition: str) -> list[dict[str, str]]:
    """The kubelet's node conditions of a healthy node."""
    rows = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory",
         "kubelet has sufficient memory available"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ]  # fmt: skip
    return [
        {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": heartbeat,
            "lastTransitionTime": transition,
        }
        for kind, status, reason, message in rows
    ]


def node_status(
    pool: Pool, capacity: Mapping[str, int], allocatable: Mapping[str, int], since: str
) -> dict[str, Any]:
    """A Node's status: the pool's CPU, memory and pods plus each device-plugin
    resource (capacity: every device; allocatable: the healthy ones)."""
    base = {"cpu": str(pool.spec.cpu), "memory": pool.spec.memory, "pods": str(pool.spec.pods)}
    return {
        "capacity": base | {k: str(v) for k, v in capacity.items()},
        "allocatable": base | {k: str(v) for k, v in allocatable.items()},
        "conditions": conditions(now(), since),
        "nodeInfo": {
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
            "kernelVersion": "",
            "osImage": "devplug fleet node",
            "containerRuntimeVersion": "devplug://fleet",
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


def node_labels(name: str, fleet: str, pool: Pool, labels: Mapping[str, str]) -> dict[str, str]:
    """A Node's labels: the hardware's (`labels`), the pool's, the kubelet's own and the
    fleet's. The fit step matches selectors against these, so both placements agree."""
    return {
        **labels,
        **pool.spec.labels,
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        **fleet_labels(fleet, pool.name),
    }


def node_body(
    name: str, fleet: str, pool: Pool, labels: Mapping[str, str], status: dict[str, Any]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": node_labels(name, fleet, pool, labels)},
        "spec": {"taints": taints(pool)},
        "status": status,
    }


def taints(pool: Pool) -> list[dict[str, str]]:
    return [
        {"key": t.key, "value": t.value, "effect": t.effect} if t.value else
        {"key": t.key, "effect": t.effect}
        for t in pool.spec.taints
    ]  # fmt: skip


def lease_body(node: str, node_uid: str, fleet: str, pool: str, duration_s: int) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": node,
            "namespace": LEASE_NAMESPACE,
            "labels": fleet_labels(fleet, pool),
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}
            ],
        },
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": duration_s,
            "renewTime": now_micro(),
        },
    }


def running_status(
    containers: Sequence[Mapping[str, Any]],
    init_containers: Sequence[Mapping[str, Any]],
    waiting: Mapping[str, tuple[str, str]],
) -> dict[str, Any]:
    """A started pod's status: init containers completed (sidecars running), app
    containers running, or waiting with the reason the kubelet gives (`waiting`:
    container -> (reason, message))."""
    started = now()

    def state(container: Mapping[str, Any], init: bool) -> dict[str, Any]:
        name = str(container.get("name"))
        record: dict[str, Any] = {
            "name": name,
            "image": str(container.get("image") or ""),
            "imageID": "",
            "restartCount": 0,
        }
        if name in waiting:
            reason, message = waiting[name]
            record |= {"ready": False, "started": False}
            record["state"] = {"waiting": {"reason": reason, "message": message}}
            return record
        record["containerID"] = f"devplug://{uuid.uuid4().hex}"
        if init and container.get("restartPolicy") != "Always":
            record |= {"ready": True, "started": False}
            record["state"] = {
                "terminated": {
                    "exitCode": 0,
                    "reason": "Completed",
                    "startedAt": started,
                    "finishedAt": started,
                }
            }
        else:
            record |= {"ready": True, "started": True}
            record["state"] = {"running": {"startedAt": started}}
        return record

    ready = "False" if waiting else "True"
    status: dict[str, Any] = {
        "phase": "Pending" if waiting else "Running",
        "startTime": started,
        "conditions": [
            {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": started},
            {
                "type": "Initialized",
                "status": ready if init_containers else "True",
                "lastTransitionTime": started,
            },
            {"type": "ContainersReady", "status": ready, "lastTransitionTime": started},
            {"type": "Ready", "status": ready, "lastTransitionTime": started},
        ],
        "containerStatuses": [state(c, False) for c in containers],
    }
    if init_containers:
        status["initContainerStatuses"] = [state(c, True) for c in init_containers]
    return status


def rejected_status(reason: str, message: str) -> dict[str, Any]:
    """The kubelet's status of a pod it rejected at admission (`rejectPod`)."""
    return {"phase": "Failed", "reason": reason, "message": f"Pod was rejected: {message}"}


def event_body(
    pod: Mapping[str, Any], node: str, reason: str, message: str, fleet: str, pool: str
) -> dict[str, Any]:
    """A Warning Event on the pod from the node's kubelet, as `rejectPod` records it."""
    meta = pod["metadata"]
    stamp = now()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{meta['name']}.{uuid.uuid4().hex[:16]}",
            "namespace": meta["namespace"],
            "labels": fleet_labels(fleet, pool),
        },
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        },
        "reason": reason,
        "message": message,
        "type": "Warning",
        "source": {"component": "kubelet", "host": node},
        "reportingComponent": "kubelet",
        "reportingInstance": node,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
