"""The deploy DeviceClass 'a GPU with at least 40 GiB' (a CEL compareTo on the memory
capacity), allocated by the real scheduler among the GPUs the daemon publishes from
(fake) NVML: the 40 GiB one, never the 24 GiB one.

One node serves the whole file (module-scoped fixtures); each test checks one
behaviour of it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

from devplug.fakes.nvml import FakeGpuHost, gpu, gpu_uuid
from devplug.simulator import Kubelet, PodResult
from tests.dra_cluster_helpers import (
    ROOT,
    admitted,
    device_class_made,
    node_serving,
    pending,
    pod_body,
    scheduled_message,
    slice_devices,
    slice_where,
)
from tests.dra_helpers import NodeDirs

pytestmark = pytest.mark.asyncio(loop_scope="module")

GPU_DRIVER = "gpu.devplug.io"


@pytest.fixture(scope="module")
def big_class(api: Any) -> Iterator[str]:
    """The deploy class of GPUs with 40 GiB or more (the deploy test makes it too)."""
    import yaml

    classes = (ROOT / "deploy" / "dra" / "component" / "deviceclasses.yaml").read_text()
    [big] = [
        c for c in yaml.safe_load_all(classes) if c["metadata"]["name"] == "gpu-40gib.devplug.io"
    ]
    with device_class_made(api, big):
        yield big["metadata"]["name"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def serving(
    kubeconfig: str, api: Any, node: str, big_class: str, module_dirs: NodeDirs
) -> AsyncIterator[Kubelet]:
    """The node serving an A10 (24 GiB) and an A100 (40 GiB) through DRA."""
    import yaml

    small = gpu(0, name="NVIDIA A10", memory_gib=24, cc=(8, 6), numa=0)
    large = gpu(1, name="NVIDIA A100-SXM4-40GB", memory_gib=40, cc=(8, 0), numa=0)
    description = {"driver": {"loaded": True}, "gpus": [small, large], "topology": [], "xids": []}
    host = FakeGpuHost(module_dirs.root / "gpus", description)
    config = module_dirs.root / "gpus.yaml"
    entry = {"nvidia": {"hostRoot": host.host_root}, "mode": "dra", "dra": {"driver": GPU_DRIVER}}
    config.write_text(yaml.safe_dump({"resources": [entry]}))
    async with node_serving(module_dirs, api, kubeconfig, config, GPU_DRIVER, host.env) as kubelet:
        yield kubelet


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def published(serving: Kubelet, api: Any) -> dict[str, Any]:
    return await slice_where(
        api, lambda o: o["spec"]["driver"] == GPU_DRIVER and len(slice_devices(o)) == 2
    )


def gpu_claim(name: str, device_class: str) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": device_class}}
    return {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}}


@dataclass(frozen=True)
class Allocated:
    uid: str
    pod: PodResult
    device: str  # the name of the device allocated
    spec: dict[str, Any]  # the claim's CDI spec


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def allocated(
    serving: Kubelet,
    published: dict[str, Any],
    big_class: str,
    api: Any,
    module_namespace: str,
    module_dirs: NodeDirs,
) -> Allocated:
    """A claim of the class and its pod, admitted by the node."""
    from kubernetes import client

    resource = client.ResourceV1Api(api)
    claim = resource.create_namespaced_resource_claim(
        module_namespace, gpu_claim("big-gpu", big_class)
    )
    client.CoreV1Api(api).create_namespaced_pod(
        module_namespace, pod_body("pod-big-gpu", "big-gpu")
    )
    pod = await admitted(serving, "pod-big-gpu", module_namespace)
    read = resource.read_namespaced_resource_claim("big-gpu", module_namespace)
    [result] = read.status.allocation.devices.results
    uid = claim.metadata.uid
    spec = json.loads((module_dirs.cdi / f"{GPU_DRIVER}-{uid}.json").read_text())
    return Allocated(uid, pod, result.device, spec)


async def test_the_slice_publishes_the_memory_of_each_gpu(published: dict[str, Any]) -> None:
    memory = {
        d["attributes"]["uuid"]["string"]: d["capacity"]["memory"]["value"]
        for d in slice_devices(published).values()
    }
    assert memory == {gpu_uuid(0): str(24 << 30), gpu_uuid(1): str(40 << 30)}


async def test_the_scheduler_gives_the_claim_the_40_gib_gpu(
    allocated: Allocated, published: dict[str, Any]
) -> None:
    chosen = slice_devices(published)[allocated.device]
    assert chosen["attributes"]["uuid"] == {"string": gpu_uuid(1)}


async def test_the_container_gets_the_cdi_device_of_that_gpu_alone(allocated: Allocated) -> None:
    assert allocated.pod.containers[0].options.cdi_devices == [
        f"{GPU_DRIVER}/claim={allocated.uid}-{allocated.device}"
    ]
    [device] = allocated.spec["devices"]
    nodes = {n["path"] for n in device["containerEdits"]["deviceNodes"]}
    assert "/dev/nvidia1" in nodes
    assert "/dev/nvidia0" not in nodes
    assert f"NVIDIA_VISIBLE_DEVICES={gpu_uuid(1)}" in allocated.spec["containerEdits"]["env"]


async def test_a_second_claim_waits_as_the_free_24_gib_gpu_does_not_qualify(
    allocated: Allocated, big_class: str, api: Any, module_namespace: str
) -> None:
    from kubernetes import client

    client.ResourceV1Api(api).create_namespaced_resource_claim(
        module_namespace, gpu_claim("second-gpu", big_class)
    )
    client.CoreV1Api(api).create_namespaced_pod(
        module_namespace, pod_body("pod-second-gpu", "second-gpu")
    )
    refused = await pending(api, "pod-second-gpu", module_namespace)
    assert refused["status"]["phase"] == "Pending"
    assert "cannot allocate all claims" in scheduled_message(refused)
