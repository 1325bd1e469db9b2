"""The scheduler extender on the real node: a second real kube-scheduler (the cluster's
own binary) with a profile `devplug-extender` calling `devplug extender` (best fit), the
real daemon serving the fake NVML's two GPUs in shares (`replicaPolicy: extender`, ten
replicas of 100 milli-GPUs each) as a host process of the node, and the real kubelet
admitting the pods: every container gets the GPU the extender chose, and an extender
restarted in the middle places the next pod from what the pods say, as if it had never
stopped."""

from __future__ import annotations

import contextlib
import re
import sys
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
from tests.serve_helpers import free_port

RESOURCE = "devplug.io/gpu-milli"
SCHEDULER = "devplug-extender"
WAIT_S = 90.0
SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "extender" / "scheduler.yaml"


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


def extender(real_node: RealNode, folder: Path, port: int) -> Any:
    command = [sys.executable, "-m", "devplug.cli.main", "extender", "--policy", "bestfit"]
    command += ["--port", str(port), "--kubeconfig", str(real_node.kubeconfig)]
    return process(command, folder / "extender.log")


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


@pytest.mark.timeout(420)
def test_the_real_scheduler_with_the_extender_gives_each_container_the_gpu_it_chose(
    real_node: RealNode,
) -> None:
    from kubernetes import client

    core = client.CoreV1Api(real_node.api)
    gpu0, gpu1 = gpu_uuid(0), gpu_uuid(1)
    with tempfile.TemporaryDirectory(prefix="devplug-extender-") as tmp:
        folder = Path(tmp)
        host = FakeGpuHost(folder / "gpus", {"driver": {"loaded": True}, "gpus": [gpu(0), gpu(1)]})
        nvidia = {"hostRoot": host.host_root, "replicas": 10, "replicaPolicy": "extender"}
        document = {"devRoot": host.dev_root, "resources": [{"name": RESOURCE, "nvidia": nvidia}]}
        (folder / "config.yaml").write_text(yaml.safe_dump(document))
        serve = [sys.executable, "-m", "devplug.cli.main", "serve", "--config"]
        serve += [str(folder / "config.yaml"), "--node-name", real_node.node_name]
        serve += ["--kubeconfig", str(real_node.kubeconfig)]
        port = free_port()
        (folder / "scheduler.yaml").write_text(
            yaml.safe_dump(scheduler_config(real_node.kubeconfig, port))
        )
        scheduler = [str(real_node.bin_dir / "kube-scheduler"), "--config"]
        scheduler += [str(folder / "scheduler.yaml"), "--bind-address=127.0.0.1"]
        scheduler += [f"--secure-port={free_port()}"]
        popen = lambda command, **kw: real_node.popen(*command, **kw)  # noqa: E731

        def published(node: dict[str, Any]) -> bool:
            notes = node["metadata"].get("annotations") or {}
            return node["metadata"]["name"] == real_node.node_name and INVENTORY in notes

        with (
            process(serve, folder / "daemon.log", env=host.env, popen=popen),
            process(scheduler, folder / "scheduler.log"),
            real_node.namespace("extender") as ns,
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

            with extender(real_node, folder, port):
                # Best fit: the fullest GPU that holds the share.
                assert run("a-300", 3) == gpu0
                assert run("b-500", 5) == gpu0
                assert run("c-400", 4) == gpu1  # 200 left on GPU 0
            with extender(real_node, folder, port):
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
