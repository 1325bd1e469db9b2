"""Pods asking by count, given a claim by the real scheduler through a DeviceClass with
extendedResourceName, and the examples of docs/dra.md served and applied as written."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from devplug.framework.dra.classes import device_class
from tests.dra_cluster_helpers import (
    admitted,
    device_class_made,
    node_serving,
    our_slice,
    slice_where,
)
from tests.dra_helpers import DRIVER, RESOURCE, NodeDirs, accelerator_config


@pytest.fixture
def counted_class(api: Any) -> Iterator[str]:
    """The class of DRIVER's devices that pods ask by count of RESOURCE, as
    `devplug check --device-classes` writes it."""
    with device_class_made(api, device_class(DRIVER, RESOURCE)) as body:
        yield body["metadata"]["name"]


async def test_a_pod_asking_by_count_gets_its_device_through_dra(
    kubeconfig: str, api: Any, node: str, namespace: str, dirs: NodeDirs, counted_class: str
) -> None:
    """A DeviceClass with extendedResourceName, as `devplug check --device-classes`
    writes it: a pod asking `example.com/acc: 1` with no claim is given a claim by the
    real scheduler (status.extendedResourceClaimStatus), and the simulator, as the
    kubelet does, prepares it through the driver and gives the container its devices."""
    from kubernetes import client

    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    config = accelerator_config(dirs, {"acc0": "u250", "acc1": "u280"})
    pod = {
        "metadata": {"name": "counted"},
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "registry.example/app:1",
                    "resources": {"limits": {RESOURCE: "2"}},
                }
            ]
        },
    }

    async with node_serving(dirs, api, kubeconfig, config, DRIVER) as kubelet:
        await slice_where(api, our_slice(lambda d: len(d) == 2))
        core.create_namespaced_pod(namespace, pod)
        admitted_pod = await admitted(kubelet, "counted", namespace)
        status = core.read_namespaced_pod("counted", namespace).status
        made = status.extended_resource_claim_status.resource_claim_name
        claim = resource.read_namespaced_resource_claim(made, namespace)
        assert claim.metadata.annotations["resource.kubernetes.io/extended-resource-claim"]
        uid = claim.metadata.uid
        assert sorted(admitted_pod.containers[0].options.cdi_devices) == [
            f"{DRIVER}/claim={uid}-acc0",
            f"{DRIVER}/claim={uid}-acc1",
        ]
        # The device manager has no such resource: it gave the container nothing.
        assert admitted_pod.containers[0].devices == {}


async def test_the_examples_of_the_dra_page_run(
    kubeconfig: str, api: Any, node: str, namespace: str, dirs: NodeDirs
) -> None:
    """docs/dra.md as written: its config served (the card paths made here), its
    DeviceClass, claim and pods applied; the scheduler gives the u280 to the claim and
    the other card to the pod asking by count, and both are prepared."""
    from kubernetes import client, utils

    from tests.unit.test_dra_docs import config_examples, manifests

    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    for i in (0, 1):
        dirs.make_device(f"xclmgmt{i}")
    config = dirs.root / "config.yaml"
    text = config_examples()[0].replace("/dev/xclmgmt", f"{dirs.dev}/xclmgmt")
    config.write_text(text.replace("    mode: dra", "    mode: dra\n    allowAnyPath: true", 1))
    wanted = {"fpga.devplug.io", "one-u280", "synth", "counted-fpga"}
    objects = [m for m in manifests() if m["metadata"]["name"] in wanted]
    driver = "fpga.devplug.io"

    # The page's DeviceClass is cluster-wide: made for this test only, as other tests
    # of this control plane create one of the same name.
    [page_class] = [o for o in objects if o["kind"] == "DeviceClass"]
    objects.remove(page_class)
    async with node_serving(dirs, api, kubeconfig, config, driver) as kubelet:
        await slice_where(
            api,
            lambda s: s["spec"]["driver"] == driver and len(s["spec"]["devices"]) == 2,
        )
        with device_class_made(api, page_class):
            utils.create_from_yaml(api, yaml_objects=objects, namespace=namespace)
            synth = await admitted(kubelet, "synth", namespace)
            claim = resource.read_namespaced_resource_claim("one-u280", namespace)
            assert synth.containers[0].options.cdi_devices == [
                f"{driver}/claim={claim.metadata.uid}-fpga1"
            ]
            counted = await admitted(kubelet, "counted-fpga", namespace)
            [cdi] = counted.containers[0].options.cdi_devices
            assert cdi.endswith("-fpga0")
            spec = json.loads((dirs.cdi / f"{driver}-{claim.metadata.uid}.json").read_text())
            assert "DEVPLUG_DEVPLUG_IO_FPGA=fpga1" in spec["containerEdits"]["env"]
            assert core.read_namespaced_pod(
                "counted-fpga", namespace
            ).status.extended_resource_claim_status
