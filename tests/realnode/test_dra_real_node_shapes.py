"""Partitions and shares on the real node: the real daemon as a host process of the
node, the real scheduler allocating the docs' half-a-card template and bandwidth
shares of a link, the real kubelet preparing them, and containerd 2.3 applying each
claim's CDI devices: every container is checked inside for its device node and env."""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug.testing.controlplane import watch_until
from devplug.testing.realnode import RealNode, pod_ready, unschedulable
from tests.dra_helpers import Daemon
from tests.hw_helpers import wait_file

REGION = "region.devplug.io"
NIC = "nic.devplug.io"
CDI_DIR = Path("/var/run/cdi")


def doc_objects(*names: str) -> list[dict[str, Any]]:
    from tests.unit.test_dra_docs import manifests

    found = {m["metadata"]["name"]: m for m in manifests()}
    return [json.loads(json.dumps(found[n])) for n in names]


def config(folder: Path) -> Path:
    """The docs' partitioned card and a link shared by bandwidth, as device nodes in
    `folder`, seen in the containers as /dev/fpga0 and /dev/nic0."""
    for name in ("fpga0", "nic0"):
        os.mknod(folder / name, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    from tests.unit.test_dra_docs import blocks

    [block] = [b for b in blocks("yaml") if b.startswith("resources:") and "region" in b]
    card = yaml.safe_load(block)["resources"][0]
    card["groups"][0]["paths"] = [{"path": str(folder / "fpga0"), "containerPath": "/dev/fpga0"}]
    nic = {
        "name": "example.com/nic",
        "mode": "dra",
        "allowAnyPath": True,
        "dra": {
            "driver": NIC,
            "consumableCapacity": {
                "bandwidth": {
                    "value": "100G",
                    "requestPolicy": {"default": "10G", "validValues": ["10G", "25G", "50G"]},
                }
            },
        },
        "groups": [
            {"id": "nic0", "paths": [{"path": str(folder / "nic0"), "containerPath": "/dev/nic0"}]}
        ],
    }
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump({"resources": [card, nic]}))
    return path


def reporting_pod(real_node: RealNode, name: str, namespace: str, claim: dict[str, Any]) -> Any:
    """A busybox pod holding `claim` (a pod claim entry) that prints its env and device
    nodes, then sleeps."""
    pod = real_node.busybox_pod(
        name,
        namespace=namespace,
        command=("sh", "-c", "env; ls -l /dev/fpga0 /dev/nic0 2>&1; sleep 3600"),
    )
    pod["spec"]["resourceClaims"] = [claim]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": claim["name"]}]}
    return pod


def inside(real_node: RealNode, namespace: str, pod: str) -> tuple[dict[str, str], str]:
    """The container's env and what it found of the device nodes."""
    text = real_node.kubectl("logs", "-n", namespace, pod).stdout
    env = dict(m.groups() for m in re.finditer(r"^([A-Z_][A-Z0-9_]*)=(.*)$", text, re.M))
    return env, text


@contextlib.contextmanager
def serving(real_node: RealNode, folder: Path) -> Iterator[None]:
    """`devplug serve` as a host process of the node; its slices and classes removed
    after."""
    from kubernetes import client

    resource = client.ResourceV1Api(real_node.api)
    args = [sys.executable, "-m", "devplug.cli.main", "serve", "--config", str(config(folder))]
    args += ["--node-name", real_node.node_name, "--kubeconfig", str(real_node.kubeconfig)]
    log = folder / "daemon.log"
    daemon = Daemon(args, log, popen=lambda command, **kw: real_node.popen(*command, **kw))
    try:
        for driver in (REGION, NIC):
            watch_until(
                real_node.api,
                resource.list_resource_slice,
                lambda o, d=driver: o["spec"]["driver"] == d,
                timeout=60,
            )
        yield
    finally:
        daemon.stop()
        for driver in (REGION, NIC):
            resource.delete_collection_resource_slice(field_selector=f"spec.driver={driver}")


SHARES = {"share-a": "25G", "share-b": "50G"}
HALVES = ("half-0", "half-1", "half-2")


def start_pods(real_node: RealNode, ns: str, half: dict[str, Any]) -> None:
    """Three pods of the docs' half-a-card template, and a pod per bandwidth share."""
    real_node.create({**half, "metadata": {**half["metadata"], "namespace": ns}})
    for name in HALVES:
        claim = {"name": "region", "resourceClaimTemplateName": "half-fpga"}
        real_node.create(reporting_pod(real_node, name, ns, claim))
    for name, amount in SHARES.items():
        wanted = {"deviceClassName": NIC, "capacity": {"requests": {"bandwidth": amount}}}
        request = {"name": "nic", "exactly": wanted}
        real_node.create(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"devices": {"requests": [request]}},
            }
        )
        claim = {"name": "nic", "resourceClaimName": name}
        real_node.create(reporting_pod(real_node, f"p-{name}", ns, claim))


def allocated(real_node: RealNode, ns: str, claim: str) -> dict[str, Any]:
    from kubernetes import client

    resource = client.ResourceV1Api(real_node.api)
    response = resource.read_namespaced_resource_claim(claim, ns, _preload_content=False)
    obj: dict[str, Any] = json.loads(response.data)
    return obj


def check_pods(real_node: RealNode, ns: str) -> None:
    pods = (*HALVES, *(f"p-{n}" for n in SHARES))
    state = {
        pod: real_node.wait_pod(
            ns, pod, lambda p: pod_ready(p) or bool(unschedulable(p)), timeout=90
        )
        for pod in pods
    }
    running = {pod for pod, obj in state.items() if pod_ready(obj)}
    [waiting] = sorted(set(pods) - running)
    assert waiting in HALVES  # two halves fill the card; the shares fit the link
    assert "cannot allocate all claims" in str(unschedulable(state[waiting]))
    partitions = []
    for pod in sorted(running & set(HALVES)):
        env, text = inside(real_node, ns, pod)
        assert "/dev/fpga0" in text
        assert "/dev/nic0: No such file" in text
        partitions.append(env["DEVPLUG_EXAMPLE_COM_FPGA_REGION"])
    assert sorted(partitions) == ["fpga0-slots-0-1", "fpga0-slots-2-3"]
    for name, amount in SHARES.items():
        env, text = inside(real_node, ns, f"p-{name}")
        [result] = allocated(real_node, ns, name)["status"]["allocation"]["devices"]["results"]
        assert env["DEVPLUG_DRA_SHARE_NIC0"] == result["shareID"]
        assert env["DEVPLUG_DRA_SHARE_NIC0_BANDWIDTH"] == amount
        assert "/dev/nic0" in text
        assert "/dev/fpga0: No such file" in text


@pytest.mark.timeout(300)
def test_partitions_and_shares_reach_the_containers(real_node: RealNode) -> None:
    from kubernetes import client

    resource = client.ResourceV1Api(real_node.api)
    region_class, half = doc_objects(REGION, "half-fpga")
    nic_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": NIC},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{NIC}"'}}]},
    }

    def specs() -> set[Path]:
        return {*CDI_DIR.glob(f"{REGION}-*"), *CDI_DIR.glob(f"{NIC}-*")}

    left_before = specs()  # a killed earlier run's, not this test's to wait for
    with tempfile.TemporaryDirectory(prefix="devplug-shapes-") as tmp:
        for device_class in (region_class, nic_class):
            resource.create_device_class(device_class)
        try:
            with serving(real_node, Path(tmp)):
                with real_node.namespace("shapes") as ns:
                    start_pods(real_node, ns, half)
                    check_pods(real_node, ns)
                    # One share goes: unprepared alone, the other keeps its spec.
                    uid = {n: allocated(real_node, ns, n)["metadata"]["uid"] for n in SHARES}
                    real_node.kubectl("delete", "pod", "-n", ns, "p-share-a", "--wait=true")
                    wait_file(CDI_DIR / f"{NIC}-{uid['share-a']}.json", lambda t: t is None)
                    assert (CDI_DIR / f"{NIC}-{uid['share-b']}.json").exists()
                # The namespace gone (its pods with it), every claim is unprepared.
                for spec in specs() - left_before:
                    wait_file(spec, lambda text: text is None)
        finally:
            for device_class in (REGION, NIC):
                resource.delete_device_class(device_class)
