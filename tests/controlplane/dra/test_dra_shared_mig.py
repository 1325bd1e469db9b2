"""MIG partitions allocated by the real scheduler from what the daemon publishes (the
MIG example of docs/dra.md, an A100 40GB in MIG mode on the fake NVML): two 3g.20gb
claims get the GPU's two halves, a 1g.5gb claim waits, and the node makes each
instance at prepare.

One node serves the whole file (module-scoped fixtures, in story order); each test
checks one behaviour of it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from devplug.fakes.nvml import FakeGpuHost
from devplug.simulator import Kubelet
from tests.dra_cluster_helpers import (
    admitted,
    allocation,
    claim_from,
    device_class_made,
    doc_config,
    doc_objects,
    node_serving,
    pending,
    pod_from,
    published_by,
    resources,
    scheduled_message,
    variant,
)
from tests.dra_helpers import NodeDirs

pytestmark = pytest.mark.asyncio(loop_scope="module")

DRIVER = "mig.devplug.io"
HALVES = ("half-a", "half-b")


@pytest.fixture(scope="module")
def objects(api: Any) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """The doc's claim template and pod; its device class made meanwhile."""
    device_class, template, pod = doc_objects(DRIVER, "mig-3g", "finetune")
    with device_class_made(api, device_class):
        yield template, pod


@pytest.fixture(scope="module")
def host(module_dirs: NodeDirs) -> FakeGpuHost:
    """An A100 40GB in MIG mode, no instance made yet."""
    from devplug.fakes.gpus import gpu as mig_gpu

    description = {
        "driver": {"loaded": True},
        "gpus": [mig_gpu(0, model_key="A100-SXM4-40GB", mig=[])],
    }
    return FakeGpuHost(module_dirs.root / "gpus", description)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def serving(
    kubeconfig: str, api: Any, node: str, module_dirs: NodeDirs, host: FakeGpuHost
) -> AsyncIterator[Kubelet]:
    """The node serving the doc's MIG config, its counters published."""
    import yaml

    config = doc_config("{mig: true}")
    config["resources"][0]["nvidia"] = {"hostRoot": host.host_root}
    path = module_dirs.root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    async with node_serving(module_dirs, api, kubeconfig, path, DRIVER, host.env) as kubelet:
        await published_by(api, DRIVER, lambda spec: "sharedCounters" in spec)
        yield kubelet


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def halves(
    serving: Kubelet,
    objects: tuple[dict[str, Any], dict[str, Any]],
    api: Any,
    module_namespace: str,
) -> list[dict[str, Any]]:
    """Two claims of the doc's 3g.20gb and their pods, admitted: the attributes of the
    device the scheduler allocated to each, as published."""
    from kubernetes import client

    template, pod = objects
    for name in HALVES:
        resources(api).create_namespaced_resource_claim(
            module_namespace, claim_from(template, name)
        )
        client.CoreV1Api(api).create_namespaced_pod(
            module_namespace, pod_from(pod, f"p-{name}", name)
        )
    for name in HALVES:
        await admitted(serving, f"p-{name}", module_namespace)
    response = resources(api).list_resource_slice(_preload_content=False)
    offered = {
        d["name"]: d
        for s in json.loads(response.data)["items"]
        if s["spec"]["driver"] == DRIVER
        for d in s["spec"].get("devices") or []
    }
    found = []
    for name in HALVES:
        [result] = allocation(resources(api), name, module_namespace)
        found.append(offered[result["device"]]["attributes"])
    return found


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def small_refused(
    halves: list[dict[str, Any]],
    objects: tuple[dict[str, Any], dict[str, Any]],
    api: Any,
    module_namespace: str,
) -> dict[str, Any]:
    """A 1g.5gb claim's pod, once the scheduler gave up on it."""
    from kubernetes import client

    template, pod = objects
    small = variant(template, f'device.attributes["{DRIVER}"].migProfile == "1g.5gb"')
    resources(api).create_namespaced_resource_claim(module_namespace, claim_from(small, "small"))
    client.CoreV1Api(api).create_namespaced_pod(module_namespace, pod_from(pod, "p-small", "small"))
    return await pending(api, "p-small", module_namespace)


@pytest.fixture(scope="module")
def instances(small_refused: dict[str, Any], host: FakeGpuHost) -> list[tuple[int, int]]:
    """The GPU instances on the GPU (start, size), once the 1g.5gb claim was refused."""
    host.reload()
    return sorted((g["start"], g["size"]) for g in host.gpu(0)["gpuInstances"])


async def test_each_3g_claim_is_allocated_a_3g_partition(halves: list[dict[str, Any]]) -> None:
    assert [a["migProfile"] for a in halves] == [{"string": "3g.20gb"}] * 2


async def test_the_two_3g_partitions_are_the_gpus_two_halves(
    halves: list[dict[str, Any]],
) -> None:
    assert sorted(a["migPlacement"]["int"] for a in halves) == [0, 4]


async def test_a_1g_claim_waits_while_the_halves_take_the_gpu(
    small_refused: dict[str, Any],
) -> None:
    assert "cannot allocate all claims" in scheduled_message(small_refused)


async def test_the_node_makes_each_allocated_instance_at_prepare(
    instances: list[tuple[int, int]],
) -> None:
    assert instances == [(0, 4), (4, 4)]
