"""The scheduler extender on the real node: the shipped deploy/extender applied with
`kubectl apply -k` (the image of `make image`, best fit), ready once its cache has
listed the cluster (its readinessProbe); a second real kube-scheduler (the cluster's
own binary, as the node has no image of it) with the shipped profile calling it; the
shipped deploy/overlays/gpu-shares DaemonSet serving the fake NVML's two GPUs in
shares (`replicaPolicy: extender`, ten replicas of 100 milli-GPUs each), and the real kubelet
admitting the pods: every container gets the GPU the extender chose, and an extender
restarted in the middle (its Deployment scaled to none and back) places the next pod
from what the pods say, as if it had never stopped."""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug.fakes.gpus import FakeGpuHost, gpu, gpu_uuid
from devplug.placement.inventory import ASSIGNED, GIVEN, INVENTORY
from devplug.testing.controlplane import watch_until
from devplug.testing.realnode import RealNode, pod_ready
from tests.dra_helpers import Daemon
from tests.node_helpers import DEPLOY, NAMESPACE
from tests.serve_helpers import free_port

RESOURCE = "devplug.io/gpu-milli"
SCHEDULER = "devplug-extender"
WAIT_S = 90.0
SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "extender" / "scheduler.yaml"
DEPLOYMENT = "deployment/devplug-extender"
SELECTOR = "app.kubernetes.io/name=devplug-extender"


def scheduler_config(kubeconfig: Path, port: int) -> dict[str, Any]:
    """deploy/extender's KubeSchedulerConfiguration, for this cluster: its kubeconfig,
    no leader election, the extender on `port` of this host."""
    config: dict[str, Any] = yaml.safe_load(SHIPPED.read_text())
    config["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    config["leaderElection"] = {"leaderElect": False}
    [extender] = config["extenders"]
    extender["urlPrefix"] = f"http://127.0.0.1:{port}"
    return config


@contextlib.contextmanager
def process(command: list[str], log: Path, **kwargs: Any) -> Iterator[Daemon]:
    daemon = Daemon(command, log, **kwargs)
    try:
        yield daemon
    except BaseException:
        print(f"== {command[0]} {command[1:4]} log\n{daemon.output()[-4000:]}")
        raise
    finally:
        daemon.stop()


def extender_overlay(folder: Path, real_node: RealNode, port: int) -> Path:
    """deploy/extender as shipped, but for this offline one-node cluster: no
    kube-scheduler container (no image of it here: the node's own binary runs as a
    host process), the host's network (no kube-proxy: the scheduler calls the extender
    on 127.0.0.1), the API server's address, best fit, a free port."""
    folder.mkdir(parents=True, exist_ok=True)
    env = [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(real_node.apiserver_port)},
    ]
    spec = "/spec/template/spec"
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": f"{spec}/containers/0/name", "value": "kube-scheduler"},
        {"op": "remove", "path": f"{spec}/containers/0"},
        {"op": "test", "path": f"{spec}/containers/0/name", "value": "extender"},
        {"op": "add", "path": f"{spec}/hostNetwork", "value": True},
        {"op": "add", "path": f"{spec}/containers/0/env", "value": env},
        {"op": "test", "path": f"{spec}/containers/0/args/2", "value": "--policy=fgd"},
        {"op": "replace", "path": f"{spec}/containers/0/args/2", "value": "--policy=bestfit"},
        {"op": "replace", "path": f"{spec}/containers/0/args/3", "value": f"--port={port}"},
    ]
    for probe in ("livenessProbe", "readinessProbe"):
        path = f"{spec}/containers/0/{probe}/httpGet/port"
        ops.append({"op": "replace", "path": path, "value": port})
    text = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY / "extender", folder)],
        "patches": [{"target": {"kind": "Deployment"}, "patch": json.dumps(ops)}],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(text))
    return folder


def shares_overlay(folder: Path, real_node: RealNode, host: FakeGpuHost) -> Path:
    """deploy/overlays/gpu-shares as shipped, its config given the fake NVML's host
    (its folder mounted where it is on the host), the fake NVML named in the
    environment, and the API server's address (no kube-proxy here)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((DEPLOY / "overlays" / "gpu-shares" / "config.yaml").read_text())
    config["devRoot"] = host.dev_root
    [entry] = config["resources"]
    entry["nvidia"]["hostRoot"] = host.host_root
    env = dict(host.env)
    env["KUBERNETES_SERVICE_HOST"] = "127.0.0.1"
    env["KUBERNETES_SERVICE_PORT"] = str(real_node.apiserver_port)
    spec = "/spec/template/spec"
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": f"{spec}/containers/0/name", "value": "devplug"},
        {
            "op": "add",
            "path": f"{spec}/volumes/-",
            "value": {"name": "fake-gpus", "hostPath": {"path": str(host.folder)}},
        },
        {
            "op": "add",
            "path": f"{spec}/containers/0/volumeMounts/-",
            "value": {"name": "fake-gpus", "mountPath": str(host.folder)},
        },
    ]
    for name, value in env.items():
        item = {"name": name, "value": value}
        ops.append({"op": "add", "path": f"{spec}/containers/0/env/-", "value": item})
    data = [{"op": "replace", "path": "/data/config.yaml", "value": yaml.safe_dump(config)}]
    text = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY / "overlays" / "gpu-shares", folder)],
        "patches": [
            {"target": {"kind": "DaemonSet"}, "patch": json.dumps(ops)},
            {"target": {"kind": "ConfigMap"}, "patch": json.dumps(data)},
        ],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(text))
    return folder


@contextlib.contextmanager
def gpu_node(real_node: RealNode) -> Iterator[None]:
    """The node labelled as a GPU node (the overlay's affinity), unlabelled after."""
    label = "nvidia.com/gpu.present"
    real_node.kubectl("label", "node", real_node.node_name, f"{label}=true", "--overwrite")
    try:
        yield
    finally:
        real_node.kubectl("label", "node", real_node.node_name, f"{label}-")


@contextlib.contextmanager
def extender_deployed(real_node: RealNode, kustomization: Path) -> Iterator[None]:
    """The extender's Deployment applied, until it is ready (its cache synced);
    deleted afterwards."""
    real_node.kubectl("apply", "-k", str(kustomization))
    try:
        extender_ready(real_node)
        yield
    except BaseException:
        print(real_node.kubectl("logs", "-n", NAMESPACE, DEPLOYMENT, check=False).stdout[-4000:])
        raise
    finally:
        real_node.kubectl(
            *("delete", "-k", str(kustomization), "--wait=true", "--ignore-not-found"),
            "--timeout=60s",
            timeout=90,
        )


def extender_ready(real_node: RealNode) -> None:
    """`kubectl rollout status`: its pod Ready, so its readinessProbe (/readyz) passed."""
    real_node.kubectl(
        *("-n", NAMESPACE, "rollout", "status", DEPLOYMENT, f"--timeout={WAIT_S:.0f}s"),
        timeout=WAIT_S + 30,
    )


def extender_restarted(real_node: RealNode) -> None:
    """The extender's Deployment scaled to none (its pod gone) and back, ready again."""
    scale = ("-n", NAMESPACE, "scale", DEPLOYMENT)
    real_node.kubectl(*scale, "--replicas=0")
    real_node.kubectl(
        *("-n", NAMESPACE, "wait", "--for=delete", "pod", "-l", SELECTOR),
        f"--timeout={WAIT_S:.0f}s",
        timeout=WAIT_S + 30,
    )
    real_node.kubectl(*scale, "--replicas=1")
    extender_ready(real_node)


def share_pod(real_node: RealNode, name: str, namespace: str, replicas: int) -> dict[str, Any]:
    pod = real_node.busybox_pod(name, {RESOURCE: replicas}, namespace=namespace)
    pod["spec"]["schedulerName"] = SCHEDULER
    return pod


def visible(real_node: RealNode, namespace: str, pod: str) -> str:
    text = real_node.kubectl(
        "exec", "-n", namespace, pod, "--", "sh", "-c", 'echo "visible $NVIDIA_VISIBLE_DEVICES"'
    ).stdout
    [seen] = re.findall(r"^visible (.*)$", text, re.M)
    return str(seen)


def shipped_tag() -> str:
    text = (DEPLOY / "extender" / "kustomization.yaml").read_text()
    images = yaml.safe_load(text)["images"]
    return str(next(i["newTag"] for i in images if i["name"] == "localhost/devplug"))


@pytest.mark.timeout(420)
def test_the_real_scheduler_with_the_extender_gives_each_container_the_gpu_it_chose(
    real_node: RealNode, real_node_image: str
) -> None:
    from kubernetes import client

    assert real_node_image == f"localhost/devplug:{shipped_tag()}"

    core = client.CoreV1Api(real_node.api)
    gpu0, gpu1 = gpu_uuid(0), gpu_uuid(1)
    with tempfile.TemporaryDirectory(prefix="devplug-extender-") as tmp:
        folder = Path(tmp)
        host = FakeGpuHost(folder / "gpus", {"driver": {"loaded": True}, "gpus": [gpu(0), gpu(1)]})
        port = free_port()
        (folder / "scheduler.yaml").write_text(
            yaml.safe_dump(scheduler_config(real_node.kubeconfig, port))
        )
        scheduler = [str(real_node.bin_dir / "kube-scheduler"), "--config"]
        scheduler += [str(folder / "scheduler.yaml"), "--bind-address=127.0.0.1"]
        scheduler += [f"--secure-port={free_port()}"]

        def published(node: dict[str, Any]) -> bool:
            notes = node["metadata"].get("annotations") or {}
            return node["metadata"]["name"] == real_node.node_name and INVENTORY in notes

        with (
            process(scheduler, folder / "scheduler.log"),
            real_node.namespace("extender") as ns,
            gpu_node(real_node),
            real_node.deployed(
                shares_overlay(folder / "shares", real_node, host), NAMESPACE, "devplug-gpu"
            ),
        ):
            watch_until(real_node.api, core.list_node, published, timeout=WAIT_S)
            real_node.wait_allocatable({RESOURCE: 20}, timeout=WAIT_S)

            def run(name: str, replicas: int) -> str:
                """The pod's GPU: the extender's choice, which its container sees."""
                real_node.create(share_pod(real_node, name, ns, replicas))
                pod = real_node.wait_pod(ns, name, pod_ready, timeout=WAIT_S)
                chosen = str(pod["metadata"]["annotations"][ASSIGNED])
                assert visible(real_node, ns, name) == chosen
                given = real_node.wait_pod(
                    ns, name, lambda p: GIVEN in p["metadata"].get("annotations", {})
                )
                assert given["metadata"]["annotations"][GIVEN] == chosen
                return chosen

            shipped = extender_overlay(folder / "kustomize", real_node, port)
            with extender_deployed(real_node, shipped):
                # Best fit: the fullest GPU that holds the share.
                assert run("a-300", 3) == gpu0
                assert run("b-500", 5) == gpu0
                assert run("c-400", 4) == gpu1  # 200 left on GPU 0
                extender_restarted(real_node)
                # Restarted: 200 free on GPU 0, 600 on GPU 1. An extender that forgot
                # would see two empty GPUs and take the first.
                assert run("d-600", 6) == gpu1
                real_node.create(share_pod(real_node, "e-700", ns, 7))

                def refused(pod: dict[str, Any]) -> bool:
                    conditions = (pod.get("status") or {}).get("conditions") or []
                    return any(c.get("reason") == "Unschedulable" for c in conditions)

                waiting = real_node.wait_pod(ns, "e-700", refused, timeout=WAIT_S)
                assert "spec" in waiting
                assert not waiting["spec"].get("nodeName")
