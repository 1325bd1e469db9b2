"""The node's side of the scheduler extender, with the real `devplug serve` on the fake
NVML, the kubelet simulator admitting pods and a real API server (the throwaway control
plane): the GPU inventory published on the Node and kept current, and each container
given replicas of the GPU the extender chose for its pod, oldest pod first."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug.fakes.gpus import FakeGpuHost, gpu, gpu_uuid
from devplug.placement.inventory import ASSIGNED, GIVEN, INVENTORY, Gpu, Inventory, decode
from devplug.testing import KubeletHarness
from devplug.testing.controlplane import watch_until

RESOURCE = "devplug.io/gpu-milli"
FAST = {"probeSeconds": 0.05, "retryMaxSeconds": 0.2, "nvmlTimeoutSeconds": 2}
WAIT_S = 60.0


def two_linked_gpus() -> dict[str, Any]:
    gpus = [gpu(0, numa=0), gpu(1, numa=0)]
    gpus[0]["nvlinks"] = [gpus[1]["busId"]] * 4
    gpus[1]["nvlinks"] = [gpus[0]["busId"]] * 4
    return {"driver": {"loaded": True}, "gpus": gpus, "topology": [[0, 10], [10, 0]], "events": []}


def config(host: FakeGpuHost) -> str:
    nvidia = {"hostRoot": host.host_root, **FAST, "replicas": 10, "replicaPolicy": "extender"}
    return yaml.safe_dump({"resources": [{"name": RESOURCE, "nvidia": nvidia}]})


def assigned_pod(name: str, node: str, gpu_id: str, replicas: int) -> dict[str, Any]:
    """A pod bound to `node` that the extender gave `gpu_id` (as its bind leaves it)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {ASSIGNED: gpu_id}},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "main",
                    "image": "docker.io/local/busybox:k8s",
                    "resources": {"limits": {RESOURCE: str(replicas)}},
                }
            ],
        },
    }


def gpus_of(devices: list[str]) -> list[str]:
    return sorted({i.partition("::")[0] for i in devices})


@pytest.mark.timeout(300)
def test_the_node_publishes_its_gpus_and_gives_each_pod_the_gpu_the_extender_chose(
    kubeconfig: str, api: Any, short_tmp: Path
) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api)
    tag = uuid.uuid4().hex[:6]
    node, namespace = f"gpus-{tag}", f"shares-{tag}"
    core.create_node({"metadata": {"name": node}})
    core.create_namespace({"metadata": {"name": namespace}})
    host = FakeGpuHost(short_tmp / "gpus", two_linked_gpus())
    gpu0, gpu1 = gpu_uuid(0), gpu_uuid(1)

    def inventory_when(accept: Any) -> Inventory:
        def wanted(obj: dict[str, Any]) -> bool:
            text = (obj["metadata"].get("annotations") or {}).get(INVENTORY)
            return obj["metadata"]["name"] == node and text is not None and accept(decode(text))

        found = watch_until(api, core.list_node, wanted, timeout=WAIT_S)
        return decode(found["metadata"]["annotations"][INVENTORY])

    def given(pod: str) -> str:
        def wanted(obj: dict[str, Any]) -> bool:
            return obj["metadata"]["name"] == pod and GIVEN in (
                obj["metadata"].get("annotations") or {}
            )

        found = watch_until(
            api, core.list_namespaced_pod, wanted, timeout=WAIT_S, namespace=namespace
        )
        return str(found["metadata"]["annotations"][GIVEN])

    with KubeletHarness() as kubelet:
        kubelet.start_serve(
            config(host),
            "--kubeconfig",
            kubeconfig,
            "--node-name",
            node,
            env=host.env,
            timeout=WAIT_S,
        )
        kubelet.wait_for_resource(RESOURCE, count=20)
        model = "NVIDIA H100 80GB HBM3"
        assert inventory_when(lambda _inv: True) == Inventory(
            RESOURCE, 100, (Gpu(gpu0, model, nvlink=0, numa=0), Gpu(gpu1, model, nvlink=0, numa=0))
        )

        # Three pods bound in this order; two of one size: the oldest is admitted first.
        for name, gpu_id, replicas in (("p1", gpu1, 3), ("p2", gpu0, 3), ("p3", gpu1, 5)):
            core.create_namespaced_pod(namespace, assigned_pod(name, node, gpu_id, replicas))
        first = kubelet.admit({RESOURCE: 3})
        second = kubelet.admit({RESOURCE: 3})
        third = kubelet.admit({RESOURCE: 5})
        assert [gpus_of(p.devices()[RESOURCE]) for p in (first, second, third)] == [
            [gpu1],
            [gpu0],
            [gpu1],
        ]
        assert (given("p1"), given("p2"), given("p3")) == (gpu1, gpu0, gpu1)

        # A request no pod of the extender's waits for is served as `pack` would.
        stray = kubelet.admit({RESOURCE: 2})
        assert gpus_of(stray.devices()[RESOURCE]) == [gpu1]
        # GPU 1 is full: a pod the extender placed there cannot be given it, and the
        # kubelet's other choice is refused rather than given.
        core.create_namespaced_pod(namespace, assigned_pod("p4", node, gpu1, 1))
        refused = kubelet.admit({RESOURCE: 1})
        assert not refused.admitted
        assert f"pod {namespace}/p4: the scheduler extender chose GPU {gpu1}" in refused.message

        # A GPU that fails is published unhealthy.
        host.inject_xid(0, 79)
        sick = inventory_when(lambda inv: not inv.gpus[0].healthy)
        assert [g.healthy for g in sick.gpus] == [False, True]
        annotations = json.loads(core.read_node(node, _preload_content=False).data)["metadata"]
        assert len(annotations["annotations"][INVENTORY]) < 400
