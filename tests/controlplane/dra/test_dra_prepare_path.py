"""The whole path with the daemon holding exactly deploy/dra's RBAC and the token of its
pod on the node: slices published, a claim allocated by the scheduler, prepared, its
device status written (Ready), unprepared and its status cleared; a claim no device
meets waits; hot-plugged devices join the slice, removed ones stay, tainted.

One node serves the whole file (module-scoped fixtures, in story order); each test
checks one behaviour of it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

from devplug.simulator import Kubelet, PodResult
from tests.dra_cluster_helpers import (
    WAIT_S,
    admitted,
    claim_body,
    claim_where,
    device_class_made,
    driver_class,
    gone,
    node_serving,
    our_slice,
    pending,
    pod_body,
    scheduled_message,
    slice_devices,
    slice_where,
)
from tests.dra_helpers import DRIVER, NODE, RESOURCE, NodeDirs, accelerator_config

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def serving(
    kubeconfig: str, sa_kubeconfig: str, api: Any, node: str, module_dirs: NodeDirs
) -> AsyncIterator[Kubelet]:
    """The node serving acc0 (u250) and acc1 (u280) in both modes, with a glob group for
    hot-plug that nothing matches yet; both counted devices registered."""
    dirs = module_dirs
    dirs.make_device("acc0")
    config = accelerator_config(
        dirs, {"acc0": "u250", "acc1": "u280"}, mode="both", preferredAllocation=False
    )
    text = config.read_text().replace(
        "  groups:\n", f"  groups:\n  - paths:\n    - path: {dirs.dev}/hot*\n", 1
    )
    config.write_text(text)
    async with node_serving(
        dirs, api, kubeconfig, config, DRIVER, daemon_kubeconfig=sa_kubeconfig
    ) as kubelet:
        await kubelet.wait_for_resource(RESOURCE, count=2, timeout=WAIT_S)
        yield kubelet


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def published(serving: Kubelet, api: Any) -> dict[str, Any]:
    """The node's slice with both devices, as first published."""
    return await slice_where(api, our_slice(lambda d: {"acc0", "acc1"} <= set(d)))


@pytest.fixture(scope="module")
def device_class(api: Any) -> Iterator[None]:
    with device_class_made(api, driver_class(DRIVER)):
        yield


@dataclass(frozen=True)
class Prepared:
    pod: PodResult
    claim: Any  # the claim as created
    allocated: Any  # the claim once the pod runs
    spec_existed: bool  # its CDI spec, once the pod runs


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def prepared(
    serving: Kubelet,
    published: dict[str, Any],
    device_class: None,
    api: Any,
    module_namespace: str,
    module_dirs: NodeDirs,
) -> Prepared:
    """A claim for the u280 and its pod, admitted by the node."""
    from kubernetes import client

    resource = client.ResourceV1Api(api)
    claim = resource.create_namespaced_resource_claim(
        module_namespace, claim_body("claim-u280", "u280")
    )
    client.CoreV1Api(api).create_namespaced_pod(
        module_namespace, pod_body("pod-u280", "claim-u280")
    )
    pod = await admitted(serving, "pod-u280", module_namespace)
    allocated = resource.read_namespaced_resource_claim("claim-u280", module_namespace)
    spec = module_dirs.cdi / f"{DRIVER}-{claim.metadata.uid}.json"
    return Prepared(pod, claim, allocated, spec.exists())


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def ready(prepared: Prepared, api: Any, module_namespace: str) -> dict[str, Any]:
    """The claim once the driver wrote its device status, with the node-bound token."""
    return await claim_where(
        api, module_namespace, "claim-u280", lambda o: bool(o["status"].get("devices"))
    )


@dataclass(frozen=True)
class Unprepared:
    spec_exists: bool  # the claim's CDI spec, once the node dropped the pod
    claim: dict[str, Any]  # the claim once its device status went


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def unprepared(
    ready: dict[str, Any],
    prepared: Prepared,
    serving: Kubelet,
    api: Any,
    module_namespace: str,
    module_dirs: NodeDirs,
) -> Unprepared:
    """The pod deleted from the API server."""
    from kubernetes import client

    client.CoreV1Api(api).delete_namespaced_pod(
        "pod-u280", module_namespace, grace_period_seconds=0
    )
    await gone(serving, "pod-u280", module_namespace)
    spec = module_dirs.cdi / f"{DRIVER}-{prepared.claim.metadata.uid}.json"
    spec_exists = spec.exists()
    cleared = await claim_where(
        api, module_namespace, "claim-u280", lambda o: not o["status"].get("devices")
    )
    return Unprepared(spec_exists, cleared)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def hot_plugged(published: dict[str, Any], api: Any, module_dirs: NodeDirs) -> dict[str, Any]:
    """The slice once a device node matching the glob group appeared."""
    module_dirs.make_device("hot0")
    return await slice_where(api, our_slice(lambda d: any("-hot0" in n for n in d)))


async def test_the_slice_is_published_for_the_node_and_owned_by_it(
    published: dict[str, Any],
) -> None:
    spec = published["spec"]
    assert (spec["nodeName"], spec["pool"]["name"]) == (NODE, NODE)
    assert spec["pool"]["resourceSliceCount"] == 1
    owner = published["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Node", NODE)


async def test_a_published_device_carries_its_attributes_and_capacity(
    published: dict[str, Any],
) -> None:
    acc1 = slice_devices(published)["acc1"]
    assert acc1["attributes"]["model"] == {"string": "u280"}
    assert acc1["attributes"]["vendor"] == {"string": "xilinx"}
    assert acc1["capacity"]["memory"]["value"] == str(8 << 30)


async def test_the_scheduler_allocates_the_device_the_claim_selects(prepared: Prepared) -> None:
    [result] = prepared.allocated.status.allocation.devices.results
    assert (result.driver, result.pool, result.device) == (DRIVER, NODE, "acc1")


async def test_the_node_prepares_the_claim_with_its_cdi_device(prepared: Prepared) -> None:
    cdi = f"{DRIVER}/claim={prepared.claim.metadata.uid}-acc1"
    assert prepared.pod.containers[0].options.cdi_devices == [cdi]
    assert prepared.spec_existed


async def test_the_driver_writes_the_device_status_ready(
    ready: dict[str, Any], prepared: Prepared, module_dirs: NodeDirs
) -> None:
    cdi = f"{DRIVER}/claim={prepared.claim.metadata.uid}-acc1"
    [status] = ready["status"]["devices"]
    assert (status["driver"], status["pool"], status["device"]) == (DRIVER, NODE, "acc1")
    [condition] = status["conditions"]
    assert (condition["type"], condition["status"]) == ("Ready", "True")
    assert status["data"]["deviceID"] == "acc1"
    assert status["data"]["deviceNodes"] == [str(module_dirs.dev / "acc1")]
    assert status["data"]["cdiDeviceIDs"] == [cdi]
    assert status["data"]["attributes"]["model"] == "u280"


async def test_a_deleted_pod_is_unprepared_and_its_device_status_cleared(
    unprepared: Unprepared,
) -> None:
    assert not unprepared.spec_exists
    assert not unprepared.claim["status"].get("devices")


async def test_a_claim_no_device_meets_waits_with_the_schedulers_reason(
    serving: Kubelet, device_class: None, api: Any, module_namespace: str
) -> None:
    from kubernetes import client

    client.ResourceV1Api(api).create_namespaced_resource_claim(
        module_namespace, claim_body("claim-u999", "u999")
    )
    client.CoreV1Api(api).create_namespaced_pod(
        module_namespace, pod_body("pod-u999", "claim-u999")
    )
    refused = await pending(api, "pod-u999", module_namespace)
    assert refused["status"]["phase"] == "Pending"
    assert "cannot allocate all claims" in scheduled_message(refused)


async def test_a_hot_plugged_device_joins_the_slice_in_a_new_pool_generation(
    hot_plugged: dict[str, Any], published: dict[str, Any]
) -> None:
    """A new generation, so the scheduler drops what it knew of the old pool."""
    assert hot_plugged["spec"]["pool"]["generation"] > published["spec"]["pool"]["generation"]


async def test_a_removed_device_stays_in_the_slice_tainted_unhealthy(
    hot_plugged: dict[str, Any], api: Any, module_dirs: NodeDirs
) -> None:
    (module_dirs.dev / "acc0").unlink()
    tainted = await slice_where(
        api, our_slice(lambda d: "taints" in d.get("acc0", {}) and len(d) == 3)
    )
    [taint] = slice_devices(tainted)["acc0"]["taints"]
    assert (taint["key"], taint["value"], taint["effect"]) == (
        "devplug.io/unhealthy",
        "device-node-missing",
        "NoSchedule",
    )
    assert "taints" not in slice_devices(tainted)["acc1"]
