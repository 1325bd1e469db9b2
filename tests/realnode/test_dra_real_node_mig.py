"""MIG partitions on the real node: the docs' MIG config and `mig-3g` template on a fake
A100 40GB in MIG mode (and a second A100 with MIG off), the real daemon as a host process
of the node, the real scheduler allocating, the real kubelet preparing (the GPU and
compute instance made on the fake NVML), and containerd 2.3 applying each claim's CDI
devices. The fake host's nodes are character devices with the driver's numbers in a temp
folder, the config's `devRoot`, so every container is checked inside: its MIG UUID, its
GPU node and the two capability nodes of its own instance, and nothing of another's.

The story runs once (a module-scoped fixture records what happened); each test checks
one behaviour of it."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug.fakes.gpus import FakeGpuHost, gpu
from devplug.testing.controlplane import watch_until
from devplug.testing.realnode import RealNode, pod_ready, unschedulable
from tests.dra_helpers import Daemon
from tests.hw_helpers import wait_file
from tests.process.test_dra_mig import mig_name
from tests.realnode.test_dra_real_node_shapes import CDI_DIR, allocated, doc_objects
from tests.unit.test_dra_docs import blocks

DRIVER = "mig.devplug.io"
A100 = "A100-SXM4-40GB"
PODS = ("mig-a", "mig-b", "mig-c")
# Run in a container: what NVIDIA_VISIBLE_DEVICES says, and each NVIDIA node as
# 'node PATH MAJOR:MINOR' (hex).
REPORT = (
    'echo "visible $NVIDIA_VISIBLE_DEVICES"; for f in /dev/nvidia* /dev/nvidia-caps/*; do'
    " [ -c $f ] && stat -c 'node %n %t:%T' $f; done; true"
)


def config(folder: Path, host: FakeGpuHost) -> Path:
    """The docs' MIG entry on the fake host, its nodes found in the fake's /dev."""
    [block] = [b for b in blocks("yaml") if b.startswith("resources:") and "mig: true" in b]
    document = yaml.safe_load(block)
    document["resources"][0]["nvidia"]["hostRoot"] = host.host_root
    document["devRoot"] = host.dev_root
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


@contextlib.contextmanager
def serving(real_node: RealNode, folder: Path, host: FakeGpuHost) -> Iterator[None]:
    """`devplug serve` on the fake NVML as a host process of the node, until every
    slice of its pool is published; its slices removed after."""
    from kubernetes import client

    resource = client.ResourceV1Api(real_node.api)
    args = [sys.executable, "-m", "devplug.cli.main", "serve"]
    args += ["--config", str(config(folder, host))]
    args += ["--node-name", real_node.node_name, "--kubeconfig", str(real_node.kubeconfig)]
    popen = lambda command, **kw: real_node.popen(*command, **kw)  # noqa: E731
    daemon = Daemon(args, folder / "daemon.log", host.env, popen=popen)
    seen: set[str] = set()

    def complete(obj: dict[str, Any]) -> bool:
        if obj["spec"]["driver"] != DRIVER:
            return False
        seen.add(obj["metadata"]["name"])
        return len(seen) == obj["spec"]["pool"]["resourceSliceCount"]

    try:
        watch_until(real_node.api, resource.list_resource_slice, complete, timeout=60)
        yield
    except BaseException:
        print(f"== daemon log\n{daemon.output()[-6000:]}")
        raise
    finally:
        daemon.stop()
        resource.delete_collection_resource_slice(field_selector=f"spec.driver={DRIVER}")


def mig_pod(real_node: RealNode, name: str, namespace: str) -> dict[str, Any]:
    """A pod of the docs' `mig-3g` template that stops at once on SIGTERM but keeps a
    grace period: deleted, it leaves the API only once the kubelet has unprepared its
    claim (a pod without one leaves at once, its claim free before it is unprepared)."""
    command = ("sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait")
    pod = real_node.busybox_pod(name, namespace=namespace, command=command)
    pod["spec"]["terminationGracePeriodSeconds"] = 30
    pod["spec"]["resourceClaims"] = [{"name": "mig", "resourceClaimTemplateName": "mig-3g"}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "mig"}]}
    return pod


def claim_of(pod: dict[str, Any]) -> str:
    [status] = pod["status"]["resourceClaimStatuses"]
    name: str = status["resourceClaimName"]
    return name


def seen_inside(real_node: RealNode, ns: str, pod: str) -> tuple[str, dict[str, tuple[int, int]]]:
    """NVIDIA_VISIBLE_DEVICES in the container, and its NVIDIA nodes' numbers."""
    text = real_node.kubectl("exec", "-n", ns, pod, "--", "sh", "-c", REPORT).stdout
    [visible] = re.findall(r"^visible (.*)$", text, re.M)
    nodes = {
        m[1]: (int(m[2], 16), int(m[3], 16))
        for m in re.finditer(r"^node (\S+) ([0-9a-f]+):([0-9a-f]+)$", text, re.M)
    }
    return visible, nodes


def expected(host: FakeGpuHost, start: int) -> tuple[str, dict[str, tuple[int, int]]]:
    """The MIG UUID and the nodes a container of the instance at `start` must see: GPU
    0's, the driver's shared ones, and the capability nodes of that GPU and compute
    instance (mig-minors names their minors), with the fake's own numbers."""
    host.reload()
    [made] = [g for g in host.gpu(0)["gpuInstances"] if g["start"] == start]
    [compute] = made["computeInstances"]
    minors = (Path(host.host_root) / "proc/driver/nvidia-caps/mig-minors").read_text().split()
    key = f"gpu0/gi{made['id']}"
    caps = [
        minors[minors.index(k) + 1] for k in (f"{key}/access", f"{key}/ci{compute['id']}/access")
    ]
    names = ["nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]
    names += [f"nvidia-caps/nvidia-cap{c}" for c in caps]
    nodes = {}
    for name in names:
        number = os.stat(Path(host.dev_root) / name).st_rdev
        nodes[f"/dev/{name}"] = (os.major(number), os.minor(number))
    return compute["uuid"], nodes


Seen = tuple[str, dict[str, tuple[int, int]]]  # a MIG UUID and nodes' numbers


@dataclass(frozen=True)
class Inside:
    """What a container of a claim saw, beside what it must see."""

    seen: Seen
    expected: Seen


def inside(real_node: RealNode, host: FakeGpuHost, ns: str, pod: dict[str, Any]) -> Inside:
    """What the pod's container sees, and the MIG device its claim was allocated."""
    [result] = allocated(real_node, ns, claim_of(pod))["status"]["allocation"]["devices"]["results"]
    [start] = [s for s in (0, 4) if result["device"] == mig_name("3g.20gb", s)]
    return Inside(seen_inside(real_node, ns, pod["metadata"]["name"]), expected(host, start))


@dataclass(frozen=True)
class Story:
    """Three pods of the template: two get the GPU's two 3g.20gb placements, the third
    waits; one goes and the third gets its placement; then every pod goes."""

    waiting_reason: str  # why the third waits
    first: Inside  # the containers of the two that ran
    second: Inside
    spec_left: bool  # the CDI spec of the first's claim, once it left the API
    third: Inside  # the container of the one that waited, once it runs
    instances_left: list[Any]  # GPU 0's instances once every claim is unprepared
    mig_modes: tuple[int, int]  # both GPUs', once devplug stopped


def run_pods(real_node: RealNode, host: FakeGpuHost, ns: str, template: dict[str, Any]) -> Story:
    """The story up to its last pod's deletion (the fields it knows by then)."""
    real_node.create({**template, "metadata": {**template["metadata"], "namespace": ns}})
    for name in PODS:
        real_node.create(mig_pod(real_node, name, ns))
    state = {
        name: real_node.wait_pod(
            ns, name, lambda p: pod_ready(p) or bool(unschedulable(p)), timeout=90
        )
        for name in PODS
    }
    # A 3g.20gb sits at memory slice 0 or 4: two fit, the third never overlaps them.
    first, second = sorted(n for n in PODS if pod_ready(state[n]))
    [waiting] = set(PODS) - {first, second}
    reason = str(unschedulable(state[waiting]))
    seen_second = inside(real_node, host, ns, state[second])
    seen_first = inside(real_node, host, ns, state[first])

    # One goes: unprepared (its instance destroyed, its spec removed) before it leaves
    # the API; the waiting pod gets its placement, which NVML makes only once free.
    uids = [allocated(real_node, ns, claim_of(state[n]))["metadata"]["uid"] for n in PODS]
    real_node.kubectl("delete", "pod", "-n", ns, first, "--wait=true")
    left = (CDI_DIR / f"{DRIVER}-{uids[PODS.index(first)]}.json").exists()
    third = inside(real_node, host, ns, real_node.wait_pod(ns, waiting))

    # The pods gone (before the namespace, which is quicker to delete empty), every
    # claim is unprepared: no spec, no instance left.
    real_node.kubectl("delete", "pods", "--all", "-n", ns, "--wait=true")
    for uid in uids:
        wait_file(CDI_DIR / f"{DRIVER}-{uid}.json", lambda text: text is None)
    host.reload()
    instances = host.gpu(0).get("gpuInstances", [])
    return Story(reason, seen_first, seen_second, left, third, instances, (-1, -1))


@pytest.fixture(scope="module")
def story(real_node: RealNode) -> Story:
    """The story, run once on the node, on two A100s (GPU 0 in MIG mode)."""
    from kubernetes import client

    resource = client.ResourceV1Api(real_node.api)
    device_class, template = doc_objects(DRIVER, "mig-3g")
    with tempfile.TemporaryDirectory(prefix="devplug-mig-") as tmp:
        gpus = [gpu(0, model_key=A100, mig=[]), gpu(1, model_key=A100)]
        host = FakeGpuHost(Path(tmp) / "gpus", {"driver": {"loaded": True}, "gpus": gpus})
        resource.create_device_class(device_class)
        try:
            with serving(real_node, Path(tmp), host), real_node.namespace("mig") as ns:
                told = run_pods(real_node, host, ns, template)
            return replace(told, mig_modes=(host.gpu(0)["migMode"], host.gpu(1)["migMode"]))
        finally:
            resource.delete_device_class(DRIVER)


def test_a_third_3g_pod_waits_while_two_run(story: Story) -> None:
    assert "cannot allocate all claims" in story.waiting_reason


def test_a_container_sees_its_mig_device_and_only_its_own_instances_nodes(story: Story) -> None:
    for container in (story.first, story.second):
        assert container.seen == container.expected
        assert container.expected[1]["/dev/nvidia0"][0] == 195


def test_the_two_running_pods_get_different_mig_devices(story: Story) -> None:
    assert story.first.expected[0] != story.second.expected[0]


def test_a_deleted_pods_claim_is_unprepared_before_it_leaves_the_api(story: Story) -> None:
    assert not story.spec_left


def test_the_waiting_pod_gets_the_freed_placement(story: Story) -> None:
    assert story.third.seen == story.third.expected
    assert story.third.expected[1]["/dev/nvidia0"][0] == 195
    assert story.third.expected[0] != story.second.expected[0]


def test_every_claim_is_unprepared_once_its_pod_is_gone(story: Story) -> None:
    assert story.instances_left == []


def test_the_mig_mode_of_either_gpu_is_never_changed(story: Story) -> None:
    assert story.mig_modes == (1, 0)
